#!/usr/bin/env bash
# The conformance suite as a CI job: what ci/github-actions.yml and ci/gitlab-ci.yml call (and
# tdc_ci_recipes_test runs). Usable from any repository that clones or vendors tdc:
#
#   tdc-src/ci/conformance-job.sh setup        # ./tdc setup (packages, venv, build), cache-aware
#   tdc-src/ci/conformance-job.sh [run] [opts] # ./tdc run ...; artifacts in OUT; the verdict
#
# Inputs of `run` (a flag wins over its environment variable; empty means "not given"):
#   --impl LIB.so         IMPL_LIB     implementation library in place of libtdc.so (tdc run --impl)
#   --backend NAME        BACKEND      c10d backend (default gloo)
#   --backend-lib LIB.so  BACKEND_LIB  plug-in that registers BACKEND
#   --repeat N            REPEAT       run every test N times; a test that changes status is FLAKY
#   --out DIR             OUT          artifacts directory (default results)
#   --filter GLOB         FILTER       GoogleTest filter (default: every conformance test)
#   --expectations FILE   EXPECTATIONS known failures (docs/results-schema.md)
#   -- ARGS...            TDC_RUN_ARGS more `tdc run` options (the variable is split on spaces)
#   TDC_CLI: the command that runs tdc (default: this tree's ./tdc bootstrap); a built
#   build/tdc-cli skips the bootstrap's checks.
# Artifacts in OUT: results.json, junit.xml, logs/, report.html + report.md (when this tdc writes
# them), verdict.txt (the verdict line).
# Exit status of `run`: 0 when tdc run succeeded AND results.json holds at least one test and no
# test with a failure status (FAIL, XPASS, TIMEOUT, CRASH, FLAKY); 1 otherwise; 2 on a usage or
# setup error (tdc run's own 2 included); 130 when interrupted.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FAILURE_STATUSES='["FAIL","XPASS","TIMEOUT","CRASH","FLAKY"]'

say() { printf 'conformance-job: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 2; }

# [Note: cached builds and checkout times] A CI cache restores build/ with its old mtimes, but a
# fresh checkout gives every source file the current time, so ninja would rebuild everything.
# After a successful setup we record a digest of the sources in the build directory; when the
# next setup finds the same digest (the very sources that build was made from), it sets the
# sources' mtimes back to a fixed old date so ninja sees nothing to do. With any other digest the
# times are left alone and ninja rebuilds what it must: a stale cache costs time, never a wrong build.
source_files() {
  (cd "$ROOT" && find . \( -path ./.git -o -path ./.venv -o -path ./.tdc -o -path './build*' -o -path ./results \
    -o -name __pycache__ \) -prune -o -type f -print0)
}
source_digest() { (cd "$ROOT" && source_files | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1); }

setup() {
  local build=${TDC_BUILD_DIR:-$ROOT/build}
  local stamp=$build/.tdc-ci-source-digest digest
  digest=$(source_digest)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
    say "cached build $build matches the sources: keeping it (sources dated 2000-01-01)"
    (cd "$ROOT" && source_files | xargs -0 touch -h -d '2000-01-01 00:00:00')
  elif [ -d "$build" ]; then
    say "cached build $build was made from other sources: ninja rebuilds what changed"
  fi
  "$ROOT/tdc" setup
  printf '%s\n' "$digest" >"$stamp"
}

# Counts per status from results.json's tests (not its summary, not tdc run's exit code).
status_counts() {
  jq -r '[.tests[].status] | group_by(.) | map("\(.[0]) \(length)") | .[]' "$1"
}

run() {
  local impl=${IMPL_LIB:-} backend=${BACKEND:-} backend_lib=${BACKEND_LIB:-} repeat=${REPEAT:-}
  local out=${OUT:-results} filter=${FILTER:-} expectations=${EXPECTATIONS:-}
  local -a extra=()
  read -r -a extra <<<"${TDC_RUN_ARGS:-}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --impl|--backend|--backend-lib|--repeat|--out|--filter|--expectations)
        [ $# -ge 2 ] || die "option '$1' needs a value"
        case "$1" in
          --impl) impl=$2 ;; --backend) backend=$2 ;; --backend-lib) backend_lib=$2 ;;
          --repeat) repeat=$2 ;; --out) out=$2 ;; --filter) filter=$2 ;; --expectations) expectations=$2 ;;
        esac
        shift 2 ;;
      --) shift; extra+=("$@"); break ;;
      *) die "unknown argument '$1' (inputs: --impl --backend --backend-lib --repeat --out --filter --expectations, -- ARGS)" ;;
    esac
  done
  command -v jq >/dev/null || die "jq is not installed (./tdc setup installs it): it reads results.json"
  mkdir -p "$out" || die "cannot create the artifacts directory '$out'"
  out=$(cd "$out" && pwd)
  rm -f "$out/results.json" "$out/junit.xml" "$out/verdict.txt"  # never judge a previous run's files

  local -a args=(run --out "$out" --check)
  [ -z "$impl" ] || args+=(--impl "$impl")
  [ -z "$backend" ] || args+=(--backend "$backend")
  [ -z "$backend_lib" ] || args+=(--backend-lib "$backend_lib")
  [ -z "$repeat" ] || args+=(--repeat "$repeat")
  [ -z "$filter" ] || args+=(--filter "$filter")
  [ -z "$expectations" ] || args+=(--expectations "$expectations")
  args+=("${extra[@]}")
  local -a tdc
  read -r -a tdc <<<"${TDC_CLI:-$ROOT/tdc}"
  say "${tdc[*]} ${args[*]}"
  local rc=0
  "${tdc[@]}" "${args[@]}" || rc=$?

  verdict "$out" "$rc"
}

# Prints the one-line verdict (also to OUT/verdict.txt and a GitHub job summary) and exits.
verdict() {
  local out=$1 rc=$2 line code
  if [ ! -f "$out/results.json" ]; then
    code=$rc
    [ "$code" -ne 0 ] || code=1
    line="ERROR: tdc run exited $rc without writing $out/results.json"
  else
    local counts total bad
    counts=$(status_counts "$out/results.json") || die "'$out/results.json' is not readable JSON with tests[].status"
    total=$(jq '.tests | length' "$out/results.json")
    bad=$(jq --argjson f "$FAILURE_STATUSES" '[.tests[] | select(.status as $s | $f | index($s))] | length' \
      "$out/results.json")
    local listed
    listed=$(printf '%s' "$counts" | paste -sd, - | sed 's/,/, /g')
    if [ "$rc" -eq 0 ] && [ "$bad" -eq 0 ] && [ "$total" -gt 0 ]; then
      code=0
      line="PASS: $total tests ($listed)"
    else
      code=$rc
      [ "$code" -ne 0 ] || code=1  # tdc run said 0 but the results disagree: fail anyway
      if [ "$total" -eq 0 ]; then
        line="FAIL: no test ran (tdc run exit $rc)"
      elif [ "$bad" -gt 0 ]; then
        line="FAIL: $bad of $total tests failed ($listed; tdc run exit $rc)"
      else
        line="FAIL: tdc run exited $rc with $total tests ($listed)"
      fi
    fi
  fi
  printf '%s\n' "$line" >"$out/verdict.txt"
  if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    { printf '### tdc conformance: %s\n\n' "$line"
      [ ! -f "$out/report.md" ] || cat "$out/report.md"; } >>"$GITHUB_STEP_SUMMARY"
  fi
  printf 'conformance-job: %s; artifacts in %s\n' "$line" "$out"
  exit "$code"
}

case "${1:-run}" in
  setup) shift; [ $# -eq 0 ] || die "setup takes no arguments, got '$*'"; setup ;;
  run) [ $# -eq 0 ] || shift; run "$@" ;;
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
  *) run "$@" ;;
esac
