#!/usr/bin/env bash
# Where a suite's test time goes, per phase, from a TDC_PHASES trace ([Note: phase trace] in
# harness/include/tdc/harness/phases.h):
#   TDC_PHASES=/tmp/ph.txt ./tdc run ... ; tools/bench/phases.sh /tmp/ph.txt
# Per test (rank 0's view; times summed over tests, so parallel tests each count their own):
#   start    launch -> rank_start    fork (or thread start) of the rank, up to run_rank
#   setup    rank_start -> body_start seed and thread settings
#   group    group_start -> group_end the world group: store rendezvous, Gloo's connections
#   body     body_start -> body_end, minus group: model build, compute, collectives, checks
#   exit     the last rank's body_end -> ranks_done: results written, processes exit, reaped
#   cleanup  ranks_done -> cleaned    the test's temp dir removed
set -euo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 TRACE (a TDC_PHASES file)" >&2; exit 2; }
sort -k4,4n "$1" | awk '
  NF != 4 { bad++; next }
  $3 == "launch" { n[$1]++ }
  { k = $1 SUBSEP n[$1] }
  $3 == "launch"      { launch_t[k] = $4; runs[k] = 1 }
  $3 == "ranks_done"  { done_t[k] = $4 }
  $3 == "cleaned"     { clean_t[k] = $4 }
  $2 == 0 && $3 == "rank_start"  && !(k in start_t) { start_t[k] = $4 }
  $2 == 0 && $3 == "body_start"  && !(k in body_t)  { body_t[k] = $4 }
  $2 == 0 && $3 == "group_start" { group_from[k] = $4 }
  $2 == 0 && $3 == "group_end"   { group_s[k] += $4 - group_from[k] }
  $3 == "body_end" { if ($4 > last_end_t[k]) last_end_t[k] = $4; if ($2 == 0) end0_t[k] = $4 }
  END {
    for (k in runs) {
      if (!(k in clean_t) || !(k in start_t) || !(k in body_t) || !(k in end0_t) || !(k in done_t)) { partial++; continue }
      t["start"] += start_t[k] - launch_t[k]; t["setup"] += body_t[k] - start_t[k]; t["group"] += group_s[k]
      t["body"] += end0_t[k] - body_t[k] - group_s[k]; t["exit"] += done_t[k] - last_end_t[k]
      t["cleanup"] += clean_t[k] - done_t[k]
      total += clean_t[k] - launch_t[k]; tests++
    }
    if (tests == 0) { print "phases: no complete test in the trace" > "/dev/stderr"; exit 1 }
    printf "%d test runs, %.1f s of test time in all\n", tests, total / 1e6
    printf "| phase | seconds | share |\n|---|---|---|\n"
    split("start setup group body exit cleanup", order, " ")
    for (i = 1; i <= 6; i++) printf "| %s | %.1f | %.1f %% |\n", order[i], t[order[i]] / 1e6, 100 * t[order[i]] / total
    if (partial) printf "(%d runs left out: incomplete in the trace)\n", partial
    if (bad) printf "(%d malformed lines ignored)\n", bad
  }'
