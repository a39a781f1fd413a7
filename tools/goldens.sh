#!/usr/bin/env bash
# Regenerates every committed golden from its independent oracle. Each package's generator
# is a script in tools/ named gen-*.{py,js,sh}; this runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
for g in tools/gen-*; do
	[ -e "$g" ] || continue
	echo "goldens: $g"
	case "$g" in
	*.py) /usr/bin/python3 "$g" ;;
	*.js) node "$g" ;;
	*.sh) bash "$g" ;;
	esac
done
