#!/usr/bin/env bash
# Compile-time A/B of translation units, side by side in one run (docs/bench/build_time.md):
#
#   tools/build/tu_times.sh BUILD_DIR [TU...]
#
# Each TU is a file of BUILD_DIR/compile_commands.json: a source under the repository
# (impl/comm/backend_gloo.cpp) or a unity TU under BUILD_DIR
# (conformance/CMakeFiles/tdc_fsdp_test.dir/Unity/unity_0_cxx.cxx); default: a sample of both
# kinds of target ([Note: two shared precompiled headers], cmake/TdcPch.cmake). Each is timed
# with its compile command, one after the other, with its shared precompiled header ("pch") and
# without it ("no-pch": the -include of cmake_pch.hxx dropped, the TU's own includes only); a TU
# of a target without a PCH is the same command twice. Output goes to /tmp; nothing in BUILD_DIR
# changes. Prints a table: TU, seconds with and without, their ratio.
set -euo pipefail
build=${1:?usage: tu_times.sh BUILD_DIR [TU...]}
shift
cc=$build/compile_commands.json
[ -f "$cc" ] || { echo "tu_times: no $cc (configure the build first)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(impl/CMakeFiles/tdc_core.dir/Unity/unity_0_cxx.cxx
  impl/CMakeFiles/tdc_tensor.dir/Unity/unity_0_cxx.cxx impl/CMakeFiles/tdc_comm.dir/Unity/unity_0_cxx.cxx
  conformance/CMakeFiles/tdc_fsdp_test.dir/Unity/unity_0_cxx.cxx
  conformance/CMakeFiles/tdc_conf_fsdp_core.dir/Unity/unity_0_cxx.cxx
  conformance/CMakeFiles/tdc_comparison_test.dir/Unity/unity_0_cxx.cxx)
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || { echo "fail"; return; }; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
printf '%-68s %8s %8s %6s\n' file pch no-pch ratio
for f in "${files[@]}"; do
  path=$root/$f
  [ -f "$path" ] || path=$(cd "$build" && pwd)/$f
  cmd=$(jq -r --arg f "$path" '[.[] | select(.file == $f)][0].command // empty' "$cc")
  dir=$(jq -r --arg f "$path" '[.[] | select(.file == $f)][0].directory // empty' "$cc")
  [ -n "$cmd" ] || { echo "tu_times: $f is not in $cc" >&2; continue; }
  read -r -a args <<<"$cmd"
  with=() without=()
  skip=0
  for ((i = 0; i < ${#args[@]}; i++)); do
    a=${args[$i]}
    if [ "$a" = -o ]; then with+=(-o /tmp/tu_times.o); without+=(-o /tmp/tu_times.o); i=$((i + 1)); continue; fi
    case "$a" in -MD) continue ;; -MF | -MT) i=$((i + 1)); continue ;; esac  # no dependency files
    with+=("$a")
    if [ "$a" = -include ] && [[ ${args[$((i + 1))]} == *cmake_pch* ]]; then i=$((i + 1)); with+=("${args[$i]}"); continue; fi
    without+=("$a")
  done
  a=$(cd "$dir" && secs "${with[@]}")
  b=$(cd "$dir" && secs "${without[@]}")
  r=$( [ "$a" != fail ] && [ "$b" != fail ] && echo "scale=2; $b / $a" | bc || echo "-")
  printf '%-68s %8s %8s %6s\n' "$f" "$(printf %.1f "$a" 2>/dev/null || echo "$a")" "$(printf %.1f "$b" 2>/dev/null || echo "$b")" "$r"
done
