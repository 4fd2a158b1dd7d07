# [Note: two shared precompiled headers] Most of a tdc TU's compile is parsing the same LibTorch
# headers: torch/nn/module.h (tdc::nn::Module derives from torch::nn::Module) and, in the test
# binaries, GoogleTest. tdc compiles them once per build, as two precompiled headers that the
# targets which include them anyway reuse (CMake's REUSE_FROM):
#   lib  - ATen/core/Tensor.h, torch/nn/module.h; compiled like libtdc's components (no -g);
#          used by libtdc's components, the fixtures and the examples (none links GoogleTest).
#   test - the same and gtest/gtest.h, compiled like a test binary (-g1, GoogleTest's defines);
#          used by the suites, the conformance support library, the benchmarks and the parity
#          runner. GCC accepts a -g1 PCH in a TU compiled without -g, not the reverse: so a
#          target with -g1 must take `test`.
# A TU that reuses a PCH must be compiled with the flags it was built with (else GCC only warns
# under -Winvalid-pch, which CMake adds, and parses the headers again): the hosts below get their
# flags from the same interface targets as their users, a source with its own definitions that
# LibTorch's headers may read (impl/comm/backend_nccl.cpp's USE_CUDA) skips the PCH
# (SKIP_PRECOMPILE_HEADERS), and CTest tdc_pch_used
# (cmake/CheckPchUsed.cmake) fails when a compile given a PCH did not use it.
# Measured side by side on this project's 2-core machine (docs/bench/build_time.md, "Two shared
# precompiled headers"): a suite's unity TU 27.5-28 s -> 13.8-14.5 s; a TU that includes none of
# torch/nn/module.h (the harness, the CLI) gets slower with it (28.4 -> 33.2 s), so only the
# targets that parse torch/nn/module.h take one. A clean build: 537 -> 428 s, 1,051 -> 834
# CPU-seconds. An earlier single PCH of all of torch/torch.h (790 MB, for every target, before
# the unity builds) made no heavy TU faster and light ones twice as slow (docs/decisions.md,
# 2026-11-27 "No precompiled header", superseded).
# -DTDC_PCH=OFF builds without them: every TU then parses what it includes, which is also the
# check that each TU includes what it uses.
# [Note: ccache and the precompiled headers] ccache caches a compile that uses a PCH only with
# sloppiness pch_defines and time_macros (its manual, "Precompiled headers"); tdc's launcher sets
# them for its own compiles (CMakeLists.txt), so a warm cache still serves every object.
option(TDC_PCH "Share two precompiled headers of LibTorch (and GoogleTest) among the targets that parse them" ON)

if(TDC_PCH)
  set(_tdc_pch_source ${CMAKE_BINARY_DIR}/tdc_pch_host.cpp)
  # file(CONFIGURE) writes only when the text changes, so a reconfigure recompiles nothing.
  file(CONFIGURE OUTPUT ${_tdc_pch_source}
       CONTENT "// The host of a shared precompiled header ([Note: two shared precompiled headers]).\n")
  add_library(tdc_pch_lib OBJECT ${_tdc_pch_source})
  target_link_libraries(tdc_pch_lib PRIVATE tdc_deps)
  target_precompile_headers(tdc_pch_lib PRIVATE <ATen/core/Tensor.h> <torch/nn/module.h>)
  add_library(tdc_pch_test OBJECT ${_tdc_pch_source})
  target_link_libraries(tdc_pch_test PRIVATE tdc_test_deps)
  target_compile_options(tdc_pch_test PRIVATE -g1)
  target_precompile_headers(tdc_pch_test PRIVATE <ATen/core/Tensor.h> <torch/nn/module.h> <gtest/gtest.h>)
  set_target_properties(tdc_pch_lib tdc_pch_test PROPERTIES UNITY_BUILD OFF)
endif()

# tdc_use_pch(target lib|test): `target` reuses that precompiled header (nothing with TDC_PCH=OFF).
function(tdc_use_pch target kind)
  if(NOT kind MATCHES "^(lib|test)$")
    message(FATAL_ERROR "tdc_use_pch(${target} ${kind}): the kind is lib or test")
  endif()
  if(TDC_PCH)
    target_precompile_headers(${target} REUSE_FROM tdc_pch_${kind})
  endif()
endfunction()
