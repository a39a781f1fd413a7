#!/bin/bash
# bench-pairs.sh REGEX BENCHTIME N OLD.test NEW.test
#
# Compares two test binaries (go test -c) on a shared, loaded machine: runs them back to
# back N times, alternating which goes first, and prints per benchmark each side's minimum
# and median ns/op and the median of the per-pair NEW/OLD ratios (load drifts slowly, so
# adjacent runs see about the same machine). Run it from the package's directory when its
# benchmarks read testdata.
set -euo pipefail
re=$1; bt=$2; n=$3; A=$4; B=$5
for ((k = 0; k < n; k++)); do
	if ((k % 2 == 0)); then first=$A; second=$B; else first=$B; second=$A; fi
	for b in "$first" "$second"; do
		side=B
		[ "$b" = "$A" ] && side=A
		"$b" -test.run '^$' -test.bench "$re" -test.benchtime "$bt" | awk -v s=$side -v k=$k '/^Bench/ {print k, s, $1, $3}'
	done
done | python3 -c '
import sys, statistics
v = {}
for line in sys.stdin:
    k, side, name, ns = line.split()
    v.setdefault(name, {}).setdefault(int(k), {})[side] = float(ns)
for name, runs in sorted(v.items()):
    a = [r["A"] for r in runs.values() if "A" in r]
    b = [r["B"] for r in runs.values() if "B" in r]
    ratio = [r["B"] / r["A"] for r in runs.values() if "A" in r and "B" in r]
    if not a or not b:  # a benchmark only one binary has
        print("%s only in %s" % (name, "old" if a else "new"))
        continue
    print("%s old min %.0f med %.0f | new min %.0f med %.0f | median new/old %.3f over %d pairs"
          % (name, min(a), statistics.median(a), min(b), statistics.median(b), statistics.median(ratio), len(ratio)))
'
