#!/bin/sh
# abbench.sh OLD NEW PKG BENCH [ROUNDS] [BENCHTIME]
#
# Same-run before/after benchmark: builds PKG's test binary at git revisions OLD and NEW
# (each in a temporary worktree sharing this checkout's .cache), then hands both binaries to
# bench-pairs.sh: the benchmarks matching BENCH, alternated ROUNDS times (default 5), so
# drift in the machine's load hits both alike, with each side's median and new/old.
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
# The alternated runs and their medians are bench-pairs.sh's (run from the old tree's
# package folder, for benchmarks that read testdata).
cd "$tmp/old/$pkg"
"$root/tools/bench-pairs.sh" "$bench" "$btime" "$rounds" "$tmp/old.test" "$tmp/new.test"
