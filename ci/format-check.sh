#!/usr/bin/env bash
# Checks that every tracked C++ file is formatted by .clang-format (Debian's clang-format, which
# ./tdc installs). --fix rewrites the files instead. Run by `./tdc test` (CTest: tdc_format_check).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v clang-format >/dev/null || { echo "format-check: clang-format is not installed (./tdc setup installs it)"; exit 1; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' 2>/dev/null || find . -name '*.cpp' -o -name '*.h')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  echo "format-check: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "format-check: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($(clang-format --version)):"
  printf '  %s\n' "${bad[@]}"
  echo "fix with: ci/format-check.sh --fix"
  exit 1
fi
echo "format-check: ${#files[@]} files formatted"
