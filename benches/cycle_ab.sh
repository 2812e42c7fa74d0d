#!/usr/bin/env bash
# Before/after comparison of the uncontended cycle: runs the cycle bench's paired measurement
# (benches/cycle.rs, criterion filtered out) of two builds in alternation, one run each per round,
# and prints each round's "to bare" and "to 2 PING" ratios of token_lock, token, token_ttl and
# reentrant; benches/cycle_ab.py sums them up (median and range per build, and the per-round
# after/before ratio).
#
#   cargo bench -p redis-dlock-benches --bench cycle --no-run   # in each checkout, note the exe
#   benches/cycle_ab.sh BEFORE_EXE AFTER_EXE 5 [path/to/valkey-server] > ab.txt
#   python3 benches/cycle_ab.py ab.txt
set -u
B=$1; A=$2; N=$3; S=${4:-}
for i in $(seq 1 "$N"); do
    for which in before after; do
        exe=$B; [ "$which" = after ] && exe=$A
        if [ -n "$S" ]; then export DLOCK_TEST_SERVER=$S; fi
        DLOCK_BENCH_NO_PIN=1 DLOCK_CYCLE_RUNS=1 timeout 300 "$exe" --bench zzz_none 2>&1 |
            awk -v w="$which" -v r="$i" '/^\[cycle\] (token_lock|token|reentrant|token_ttl) /{
                match($0, /to bare [0-9.]+/); tb = substr($0, RSTART + 8, RLENGTH - 8);
                match($0, /runs [0-9.]+,/); tp = substr($0, RSTART + 5, RLENGTH - 6);
                print w, r, $2, tb, tp }'
    done
done
