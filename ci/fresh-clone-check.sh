#!/usr/bin/env bash
# The resolution check of an issue: a clean clone of HEAD, ./tdc test, then ./tdc test again with
# the ATen kernels of another CPU (ATEN_CPU_CAPABILITY=default, which every x86-64 CPU has).
# Usage: ci/fresh-clone-check.sh [DIR]   (DIR: where to clone; default a new temp dir, kept)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$(mktemp -d)}
git clone -q "$src" "$dir"
cd "$dir"
echo "fresh-clone-check: $(git log --oneline -1) in $dir" >&2
t0=$(date +%s)
./tdc test
t1=$(date +%s)
ATEN_CPU_CAPABILITY=default ./tdc test
t2=$(date +%s)
echo "fresh-clone-check: passed; native $((t1 - t0)) s (install + build + test), default $((t2 - t1)) s" >&2
