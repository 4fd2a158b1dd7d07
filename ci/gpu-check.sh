#!/usr/bin/env bash
# tdc on a GPU machine without network, in one command (docs/gpu.md):
#
#   ci/gpu-check.sh OUT [--python PY] [--steps build,unit,seed,nccl,report] [--device cuda|cpu]
#                       [--step-limit S]
#
# From a clone of tdc (ci/gpu-deps/ holds the .deb files of what the build needs that such a
# machine lacks: GoogleTest, nlohmann-json, gloo's headers, yaml-cpp, jq) and the machine's own
# CUDA PyTorch (PY, default $TDC_PYTHON or python3): unpacks the .debs into .tdc-deps/ (dpkg -x,
# never into /), builds tdc against that PyTorch with every core (./tdc with TDC_TORCH_PREFIX,
# TDC_DEPS, TDC_OFFLINE: [Note: offline dependencies] in ./tdc), then runs
#   unit   the unit suites on the device (tdc run --kind unit --device cuda)
#   seed   the 102 seed tests on the device (tdc run --kind conformance --device cuda)
#   nccl   the unit and seed suites with --backend nccl (OUT/nccl-unit, OUT/nccl-conformance:
#          what fits the GPUs runs; the tests that need more GPUs than there are skip with
#          PyTorch's skip_if_lt_x_gpu message)
#   report one report of those runs, a column each (tdc report)
# and writes OUT/<step>/ (results.json, junit.xml, logs), OUT/<step>.log, OUT/report/ and
# OUT/summary.md (the
# machine, each step's verdict and time). Every step runs even when one before it failed, but
# the build; exit 0 when every step passed. --step-limit S stops each test step after S seconds
# (its results so far are kept; the summary says so): a GPU lease is short. --device cpu runs the same steps on CPU: the check of
# this script itself on a machine without a GPU.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
usage() {
  sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
[ $# -ge 1 ] || usage
case "$1" in -h | --help) usage ;; esac
out=$1
shift
py=${TDC_PYTHON:-python3}
steps=build,unit,seed,nccl,report
device=cuda
step_limit=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py=${2:?--python needs a path}; shift 2 ;;
    --steps) steps=${2:?--steps needs a list}; shift 2 ;;
    --device) device=${2:?--device needs cuda or cpu}; shift 2 ;;
    --step-limit) step_limit=${2:?--step-limit needs seconds}; shift 2 ;;
    *) echo "gpu-check: unknown option '$1'" >&2; usage ;;
  esac
done
case "$device" in cuda | cpu) ;; *) echo "gpu-check: --device must be cuda or cpu, not '$device'" >&2; exit 2 ;; esac
case "$step_limit" in '' | *[!0-9]*) echo "gpu-check: --step-limit must be whole seconds, not '$step_limit'" >&2; exit 2 ;; esac
for s in ${steps//,/ }; do
  case "$s" in build | unit | seed | nccl | report) ;; *) echo "gpu-check: unknown step '$s' (known: build,unit,seed,nccl,report)" >&2; exit 2 ;; esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || { echo "gpu-check: no python '$py' (--python PY)" >&2; exit 2; }
torch_dir=$("$py" -c "import os, torch; print(os.path.dirname(torch.__file__))" 2>/dev/null) \
  || { echo "gpu-check: '$py' cannot import torch (--python: the interpreter of the machine's PyTorch)" >&2; exit 2; }
gpus=$("$py" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$device" = cuda ] && [ "$gpus" = 0 ]; then
  echo "gpu-check: torch at $torch_dir sees no GPU (torch.cuda.device_count() = 0): this is the GPU check; on a machine without one, --device cpu checks the script" >&2
  exit 2
fi

summary=$out/summary.md
{
  echo "# tdc gpu-check"
  echo
  echo "- tdc: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "- PyTorch: $("$py" -c "import torch; print(torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '')" 2>/dev/null) ($torch_dir)"
  echo "- GPUs: $gpus$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/; /' | tr -d '\n')"
  echo "- CPU cores: $(nproc); compiler: $(c++ --version | head -n 1)"
  echo "- device: $device"
  echo
  echo "| step | verdict | seconds |"
  echo "|---|---|---|"
} >"$summary"

failed=0
# step NAME COMMAND...: runs it with its output in OUT/NAME.log, times it, records the verdict.
step() {
  local name=$1 t0 rc=0
  shift
  echo "gpu-check: $name ..." >&2
  t0=$(date +%s)
  if [ "$step_limit" -gt 0 ] && [ "$name" != build ]; then
    timeout "$step_limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  else
    "$@" >"$out/$name.log" 2>&1 || rc=$?
  fi
  local secs=$(($(date +%s) - t0))
  local verdict=PASS
  if [ $rc = 124 ] && [ "$name" != build ] && [ "$step_limit" -gt 0 ]; then
    verdict="STOPPED at --step-limit $step_limit s ($name.log; results so far in $name/)"
    failed=1
  elif [ $rc != 0 ]; then
    verdict="FAIL (exit $rc; $name.log)"
    failed=1
  fi
  echo "| $name | $verdict | $secs |" >>"$summary"
  echo "gpu-check: $name $verdict in $secs s" >&2
  return $rc
}

# The machine's PyTorch, the carried dependencies, nothing installed: [Note: offline dependencies].
deps=$root/.tdc-deps
if [ ! -f "$deps/.unpacked" ] || [ -n "$(find "$root/ci/gpu-deps" -newer "$deps/.unpacked" -name '*.deb')" ]; then
  rm -rf "$deps"
  mkdir -p "$deps"
  for f in "$root"/ci/gpu-deps/*.deb; do dpkg -x "$f" "$deps"; done
  touch "$deps/.unpacked"
fi
export TDC_TORCH_PREFIX=$torch_dir TDC_PYTHON=$py TDC_DEPS=$deps TDC_OFFLINE=1 TDC_JOBS=${TDC_JOBS:-$(nproc)}
unset TDC_TORCH

has() { case ",$steps," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
runs=()
if has build; then
  step build "$root/tdc" build || { echo "gpu-check: the build failed; see $out/build.log" >&2; exit 1; }
fi
if has unit; then
  step unit "$root/tdc" run --kind unit --device "$device" --out "$out/unit" --no-report || true
  runs+=("$out/unit")
fi
if has seed; then
  step seed "$root/tdc" run --kind conformance --device "$device" --out "$out/seed" --no-report || true
  runs+=("$out/seed")
fi
if has nccl; then
  if [ "$device" = cuda ]; then
    for kind in unit conformance; do
      step "nccl-$kind" "$root/tdc" run --kind $kind --device cuda --backend nccl --out "$out/nccl-$kind" --no-report || true
      runs+=("$out/nccl-$kind")
    done
  else
    echo "| nccl | not run: NCCL needs --device cuda | 0 |" >>"$summary"
  fi
fi
if has report && [ ${#runs[@]} -gt 0 ]; then
  step report "$root/tdc" report "${runs[@]}" --out "$out/report" || true
fi
cat "$summary" >&2
exit $failed
