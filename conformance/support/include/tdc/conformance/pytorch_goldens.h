// Reference numbers computed by real PyTorch on the machine that checks them.
//
// [Note: goldens are computed where they are checked]
// Float results depend on the CPU: ATen picks SIMD kernels per CPU (and per
// ATEN_CPU_CAPABILITY), so even randn and sin differ in the last bits between an AVX-512, an AVX2
// and a `default` machine. Numbers written on one machine and compared exactly on another are a
// property of the two CPUs, not of tdc. So the goldens are not committed: CTest's setup step
// `tdc_goldens` runs the generators in fixtures/golden/ with the venv's PyTorch before the suites
// that read them, in the same environment (same ATEN_CPU_CAPABILITY), and the suites compare with
// the same LibTorch library under the same kernels and one thread. Differences left are the
// rounding of the float64 summaries (sums over identical float32 data), hence 1e-12 relative.
// pytorch_goldens() refuses a file made under another CPU capability or another torch, so a stale
// or foreign file fails loudly instead of comparing the wrong kernels.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace tdc::conformance {

// The golden file `name` (e.g. "fixture_models.json") from $TDC_GOLDEN_DIR, else the build's
// default goldens folder; parsed once per process. Throws std::runtime_error naming the file, the
// command that makes it, and the mismatch when it is missing, unreadable, or was computed under a
// CPU capability or torch version other than this process's.
const nlohmann::json& pytorch_goldens(const std::string& name);

// This process's ATen CPU capability ("AVX512", "AVX2", "DEFAULT", ...).
std::string cpu_capability();

}  // namespace tdc::conformance
