#!/usr/bin/env bash
# tdc from a project of its own ([Note: tdc as a CMake package]): installs tdc's build into a
# prefix, builds examples/outside/ (a test and a backend plug-in) against it with find_package(tdc),
# and runs the test with `tdc run --binary`, on Gloo and on the plug-in. CTest `tdc_outside_project`.
# Usage: ci/outside-project-check.sh TDC_BUILD WORK TORCH_DIR [CMAKE_ARG...]
#   (CMAKE_ARGs: what a CUDA LibTorch's config needs, as tdc's own build got them)
set -euo pipefail
build=$1 work=$2 torch_dir=$3
shift 3
src=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$work" && mkdir -p "$work"
step() { printf 'outside-project-check: %s\n' "$*" >&2; }

step "cmake --install $build --prefix $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
step "configure and build $src/examples/outside against it"
cmake -S "$src/examples/outside" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DTorch_DIR="$torch_dir" "$@" >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; exit 1; }
ninja -C "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

run() {  # run LABEL ARGS...: tdc run --binary on the outside test; every test must PASS
  local label=$1; shift
  step "tdc run --binary allreduce_test $*"
  "$build/tdc-cli" run --build-dir "$build" --binary "$work/build/allreduce_test" --out "$work/$label" \
    --no-report --check "$@"
  local got
  got=$(jq -r '[.tests[] | "\(.suite).\(.name)=\(.status)"] | join(" ")' "$work/$label/results.json")
  [ "$got" = "OutsideTest.AllReduceSums=PASS OutsideTest.AllGatherInRankOrder=PASS" ] \
    || { echo "outside-project-check: $label: expected both tests PASS, got: $got" >&2; exit 1; }
}
run gloo
run plugin --backend-lib "$work/build/libexample_backend.so" --backend example
backend=$(jq -r '.run_info.backend' "$work/plugin/results.json")
[ "$backend" = example ] || { echo "outside-project-check: the plug-in run reports backend '$backend', not 'example'" >&2; exit 1; }
step "passed: an installed tdc, a project of its own, its test and its plug-in"
