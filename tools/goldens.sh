#!/usr/bin/env bash
# Regenerates every committed golden from its independent oracle. Each package's generator
# is a script in tools/ named gen-*.{py,js,sh}; this runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
# The oracles: Python's own pickle/hashlib plus Debian's cbor2, xxhash, msgpack, jinja2, zmq.
oracles=(python3-cbor2 python3-xxhash python3-msgpack python3-jinja2 python3-zmq)
missing=()
for p in "${oracles[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The HF tokenizers library (Rust, as a Node addon) for token goldens.
if [ ! -d tools/node_modules/@anush008/tokenizers ]; then
	(cd tools && npm install --silent --no-save @anush008/tokenizers@0.6.0 >/dev/null)
fi
for g in tools/gen-*; do
	[ -e "$g" ] || continue
	echo "goldens: $g"
	case "$g" in
	*.py) /usr/bin/python3 "$g" ;;
	*.js) node "$g" ;;
	*.sh) bash "$g" ;;
	esac
done
