#!/usr/bin/env bash
# No function in cli/ or harness/src longer than a screen (issue 27: "a function that needs a scroll
# is usually two"). A function is a brace block opened at namespace or class level after a ")":
# its length counts the lines from its opening brace to its closing one. String and character
# literals, raw strings and comments are blanked first, so braces in format strings do not count.
# Usage: ci/function-length-check.sh [MAX_LINES] [DIR...]   (default 60, cli harness/src)
# Exit 1 naming every longer function (file:line, length, first line), 0 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
max=${1:-60}
shift || true
dirs=("$@")
[ ${#dirs[@]} -gt 0 ] || dirs=("$root/cli" "$root/harness/src")
mapfile -t files < <(find "${dirs[@]}" -name '*.cpp' -o -name '*.h' | sort)
awk -v max="$max" '
function strip(line,    out, i, c, n, q) {
  out = ""; n = length(line); i = 1
  while (i <= n) {
    c = substr(line, i, 1)
    if (in_raw) { p = index(substr(line, i), ")\""); if (p == 0) return out; i += p + 1; in_raw = 0; continue }
    if (in_comment) { p = index(substr(line, i), "*/"); if (p == 0) return out; i += p + 1; in_comment = 0; continue }
    if (substr(line, i, 2) == "//") return out
    if (substr(line, i, 2) == "/*") { in_comment = 1; i += 2; continue }
    if (substr(line, i, 3) == "R\"(") { in_raw = 1; i += 3; continue }
    if (c == "\"" || c == "\x27") {
      q = c; i++
      while (i <= n && substr(line, i, 1) != q) { if (substr(line, i, 1) == "\\") i++; i++ }
      i++; out = out q q; continue
    }
    out = out c; i++
  }
  return out
}
FNR == 1 { depth = 0; ctx = ""; in_raw = 0; in_comment = 0 }
{
  code = strip($0)
  for (k = 1; k <= length(code); k++) {
    c = substr(code, k, 1)
    if (c == "{") {
      kind = "block"
      if (depth == 0 || kinds[depth] == "namespace" || kinds[depth] == "type") {
        if (ctx ~ /(^|[^A-Za-z_])namespace([^A-Za-z_]|$)/ || ctx ~ /extern "C"/) kind = "namespace"
        else if (ctx ~ /(^|[^A-Za-z_])(class|struct|union|enum)([^A-Za-z_]|$)/ && ctx !~ /\)/) kind = "type"
        else if (ctx ~ /\)/ && ctx !~ /=[^=]*$/) kind = "function"
      }
      depth++; kinds[depth] = kind; starts[depth] = FNR; heads[depth] = head
      ctx = ""
    } else if (c == "}") {
      if (depth > 0 && kinds[depth] == "function" && FNR - starts[depth] + 1 > max)
        printf "  %s:%d: %d lines: %s\n", FILENAME, starts[depth], FNR - starts[depth] + 1, heads[depth]
      if (depth > 0) depth--
      ctx = ""
    } else if (c == ";") {
      ctx = ""
    } else {
      if (ctx == "" && c !~ /[ \t]/) head = substr($0, 1, 100)
      ctx = ctx c
    }
  }
  if (ctx != "") ctx = ctx " "
}' "${files[@]}" > /tmp/function-length-check.$$ || true
if [ -s /tmp/function-length-check.$$ ]; then
  echo "function-length-check: functions over $max lines in ${dirs[*]} (split them: a function per step):"
  cat /tmp/function-length-check.$$
  rm -f /tmp/function-length-check.$$
  exit 1
fi
rm -f /tmp/function-length-check.$$
echo "function-length-check: ${#files[@]} files, no function over $max lines"
