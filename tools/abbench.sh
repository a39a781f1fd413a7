#!/bin/sh
# abbench.sh OLD NEW PKG BENCH [ROUNDS] [BENCHTIME]
#
# Same-run before/after benchmark: builds PKG's test binary at git revisions OLD and NEW
# (each in a temporary worktree sharing this checkout's .cache), then runs the benchmarks
# matching BENCH from both, alternated ROUNDS times (default 5), so drift in the machine's
# load hits both alike. Prints each run's lines prefixed old/new, then per benchmark the
# median ns/op of each side and new/old.
set -eu
[ $# -ge 4 ] || { echo "usage: $0 OLD NEW PKG BENCH [ROUNDS] [BENCHTIME]" >&2; exit 2; }
old=$1 new=$2 pkg=$3 bench=$4 rounds=${5:-5} btime=${6:-1s}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/old" 2>/dev/null || true; git -C "$root" worktree remove --force "$tmp/new" 2>/dev/null || true; rm -rf "$tmp"' EXIT
for side in old new; do
	rev=$old
	[ "$side" = new ] && rev=$new
	git -C "$root" worktree add -q --detach "$tmp/$side" "$rev"
	[ -e "$root/.cache" ] && ln -s "$root/.cache" "$tmp/$side/.cache"
	(cd "$tmp/$side" && go test -c -o "$tmp/$side.test" "./$pkg")
done
i=0
while [ $i -lt "$rounds" ]; do
	for side in old new; do
		(cd "$tmp/$side/$pkg" && "$tmp/$side.test" -test.run '^$' -test.bench "$bench" -test.benchmem -test.benchtime "$btime") |
			grep '^Benchmark' | sed "s/^/$side /"
	done
	i=$((i + 1))
done | tee "$tmp/runs"
echo
echo "| benchmark | old median ns/op | new median ns/op | new/old |"
echo "|---|---:|---:|---:|"
awk '
{ side=$1; name=$2; for (f=3; f<NF; f++) if ($(f+1)=="ns/op") v=$f; vals[side SUBSEP name]=vals[side SUBSEP name] " " v; names[name]=1 }
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
END { for (n in names) { o = median(vals["old" SUBSEP n]); w = median(vals["new" SUBSEP n]); if (o > 0) printf "| %s | %.0f | %.0f | %.3f |\n", n, o, w, w / o } }
' "$tmp/runs" | sort
