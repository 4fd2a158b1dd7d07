#!/usr/bin/env bash
# ./tdc test while busy loops saturate every core for the whole run: a verdict that depends on
# how busy the machine is fails here. Usage: ci/stress-test.sh [ctest args...]
# Environment: TDC_STRESS_LOOPS (default: nproc) busy loops.
set -euo pipefail
cd "$(dirname "$0")/.."
loops=${TDC_STRESS_LOOPS:-$(nproc)}
pids=()
stop_loops() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop_loops EXIT INT TERM
for _ in $(seq "$loops"); do
  ( while :; do :; done ) &
  pids+=($!)
done
echo "stress-test: $loops busy loops running (pids ${pids[*]}); ./tdc test $*" >&2
start=$(date +%s)
rc=0
./tdc test "$@" || rc=$?
echo "stress-test: ./tdc test exited $rc after $(( $(date +%s) - start )) s with $loops busy loops" >&2
exit $rc
