#!/usr/bin/env bash
# Every translation unit of a configured build, compiled with ANOTHER compiler, syntax only:
# the check that tdc's sources compile under the GPU machines' g++ 13 when only g++ 12 builds
# here (docs/compat.md, "Compilers"). Debian 12 has no g++-13; clang++-16 (apt) stands in: it is
# stricter than g++ 12 where g++ 13 is (e.g. the ambiguous gtest operator== of a std::string and
# a nlohmann::json that g++ 13 rejected in conformance/unit/fixtures_test.cpp).
#
#   tools/compat/syntax_check.sh clang++-16 build          # build/compile_commands.json
#   tools/compat/syntax_check.sh g++-13 build-2.11.0 -j 4
#   tools/compat/syntax_check.sh clang++-16 build --no-pch # also: every TU names its includes
#
# Another compiler cannot read the build's precompiled header (.gch), so each TU gets the PCH's
# header text instead (a copy of cmake_pch.hxx away from its .gch), as the build sees it. With
# --no-pch it gets nothing: a file that leans on the PCH for an include it does not name fails.
# Exit 0 when every file compiles.
set -euo pipefail

usage() { echo "usage: $0 COMPILER BUILD_DIR [-j N] [--no-pch]" >&2; exit 2; }
[ $# -ge 2 ] || usage
cxx=$1
build=$2
shift 2
jobs=$(nproc)
no_pch=0
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=${2:?-j needs a number}; shift 2 ;;
    --no-pch) no_pch=1; shift ;;
    *) usage ;;
  esac
done
command -v "$cxx" >/dev/null || { echo "$0: compiler '$cxx' not found (apt install clang-16?)" >&2; exit 2; }
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "$0: '$db' does not exist: configure the build first (./tdc build)" >&2; exit 2; }
command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 2; }

logs=$(mktemp -d "${TMPDIR:-/tmp}/tdc-syntax.XXXXXX")
trap 'rm -rf "$logs"' EXIT
# Per TU: its directory, then the command with the compiler replaced, -o and the PCH
# (-include .../cmake_pch.hxx, -Winvalid-pch) removed, -fsyntax-only added. The PCH's own TU
# (cmake_pch.hxx.cxx) is skipped.
# (Two lines per TU, not @tsv: @tsv would double the backslashes of -DX=\"v\".)
jq -r '.[] | select(.file | test("cmake_pch") | not) | .directory, .command' "$db" >"$logs/tus"
total=$(($(wc -l <"$logs/tus") / 2))
echo "syntax check: $total files of $db with $cxx ($($cxx --version | head -n 1)), $jobs at a time" >&2

check_one() {  # DIR COMMAND  (run by xargs)
  local dir=$1 cmd=$2 i n file=""
  local -a words out
  eval "words=($cmd)"  # the build's own command line: shell-quoted (-DX=\"a\ b\")
  out=("$CXX")
  n=${#words[@]}
  for ((i = 1; i < n; i++)); do
    case "${words[i]}" in
      -o) ((i += 1)) ;;
      -Winvalid-pch) ;;
      -include)
        if [[ "${words[i + 1]}" == *cmake_pch* ]]; then
          ((i += 1))
          if [ "$NO_PCH" = 0 ]; then  # the PCH's text, from a copy with no .gch beside it
            local copy
            copy="$LOGS/pch/$(echo "${words[i]}" | md5sum | cut -c1-12).hxx"
            [ -f "$copy" ] || { mkdir -p "$LOGS/pch" && cp "${words[i]}" "$copy.$$" && mv "$copy.$$" "$copy"; }
            out+=(-include "$copy")
          fi
        else
          out+=("${words[i]}")
        fi ;;
      *) out+=("${words[i]}") ;;
    esac
  done
  file=${words[n - 1]}
  cd "$dir"
  local log="$LOGS/${file//\//_}.log"
  if "${out[@]}" -fsyntax-only >"$log" 2>&1; then
    rm -f "$log"
    printf '.' >&2
  else
    printf 'F' >&2
  fi
}
export -f check_one
export CXX=$cxx LOGS=$logs NO_PCH=$no_pch
xargs -d '\n' -n 2 -P "$jobs" bash -c 'check_one "$0" "$1"' <"$logs/tus"
echo >&2
failed=$(find "$logs" -maxdepth 1 -name '*.log' | wc -l)
for f in "$logs"/*.log; do
  [ -e "$f" ] || continue
  echo "---- $(basename "$f" .log)" >&2
  grep -m 20 -E 'error' "$f" >&2 || head -n 20 "$f" >&2
done
echo "syntax check: $((total - failed)) of $total files compile with $cxx" >&2
[ "$failed" = 0 ]
