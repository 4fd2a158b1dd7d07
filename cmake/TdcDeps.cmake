# Third-party dependencies, gathered into two interface targets: tdc_deps and tdc_test_deps.
find_package(Torch REQUIRED)
find_package(GTest REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Threads REQUIRED)

# LibTorch's wheel ships fmt headers but no gloo headers. fmt comes from the LibTorch copy so that
# one fmt version lives in the process (docs/decisions.md), compiled once (tdc_fmt, below).
find_path(TDC_GLOO_INCLUDE_DIR gloo/algorithm.h
  HINTS ${TORCH_INSTALL_PREFIX}/include /usr/include
  DOC "gloo headers (Debian: libgloo-dev)")
if(NOT TDC_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo headers not found: install Debian's libgloo-dev (./tdc does this)")
endif()
# xxHash's reference implementation, compiled into libtdc's checkpoint files (XXH_INLINE_ALL):
# the header only, no library at run time ([Note: the chunk checksum is XXH64]).
find_path(TDC_XXHASH_INCLUDE_DIR xxhash.h DOC "xxHash's header (Debian: libxxhash-dev)")
if(NOT TDC_XXHASH_INCLUDE_DIR)
  message(FATAL_ERROR "xxhash.h not found: install Debian's libxxhash-dev (./tdc does this)")
endif()

# What LibTorch this build is against, for results.json and the report (tdc_build_info.json):
# its release, the CUDA it was built with (torch/version.py; empty for a CPU build), the NCCL
# beside it (the nccl.h of PyPI's nvidia-nccl package, whose library LibTorch loads), and the
# compiler. [Note: configuring against a CUDA LibTorch] is in ./tdc.
set(TDC_TORCH_CUDA "")
if(EXISTS "${TORCH_INSTALL_PREFIX}/version.py")
  file(STRINGS "${TORCH_INSTALL_PREFIX}/version.py" _cuda_line REGEX "^cuda.*= *'[0-9.]+'")
  if(_cuda_line MATCHES "'([0-9.]+)'")
    set(TDC_TORCH_CUDA "${CMAKE_MATCH_1}")
  endif()
endif()
set(TDC_NCCL_VERSION "")
if(TORCH_CUDA_LIBRARIES)
  find_path(TDC_NCCL_INCLUDE_DIR nccl.h
    HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" "${TORCH_INSTALL_PREFIX}/../nvidia/cu13/include"
          "${TORCH_INSTALL_PREFIX}/include" ${CUDA_TOOLKIT_ROOT_DIR}/include /usr/include
    DOC "nccl.h of the NCCL that LibTorch loads (PyPI: nvidia-nccl-cu*)")
  if(TDC_NCCL_INCLUDE_DIR)
    file(STRINGS "${TDC_NCCL_INCLUDE_DIR}/nccl.h" _nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" _maj "${_nccl_defs}")
    string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" _min "${_nccl_defs}")
    string(REGEX REPLACE ".*NCCL_PATCH ([0-9]+).*" "\\1" _pat "${_nccl_defs}")
    set(TDC_NCCL_VERSION "${_maj}.${_min}.${_pat}")
  else()
    message(FATAL_ERROR "LibTorch is a CUDA build but nccl.h was not found beside it: set TDC_NCCL_INCLUDE_DIR")
  endif()
endif()
# ATen/cuda's headers (reached from ProcessGroupNCCL.hpp) include cuBLAS, cuSPARSE and cuSOLVER
# headers, which a minimal toolkit (nvcc + cudart) lacks; PyPI's nvidia-* packages that LibTorch
# depends on ship them beside it. Searched after the toolkit's own include dir.
set(TDC_CUDA_EXTRA_INCLUDE_DIRS "")
if(TORCH_CUDA_LIBRARIES)
  file(GLOB TDC_CUDA_EXTRA_INCLUDE_DIRS LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/cu[0-9]*/include")
endif()
set(TDC_COMPILER "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
message(STATUS "tdc: LibTorch ${Torch_VERSION}, CUDA '${TDC_TORCH_CUDA}', NCCL '${TDC_NCCL_VERSION}', ${TDC_COMPILER}")

# yaml-cpp: only tdc_ci_recipes_test (ci/) parses YAML, the CI recipes; nothing else links it.
find_package(yaml-cpp CONFIG QUIET)
if(NOT yaml-cpp_FOUND)
  message(FATAL_ERROR "yaml-cpp not found: install Debian's libyaml-cpp-dev (./tdc does this)")
endif()
if(TARGET yaml-cpp::yaml-cpp)  # yaml-cpp >= 0.8 names its target so; 0.7 (Debian 12) plain yaml-cpp
  set(TDC_YAML_CPP yaml-cpp::yaml-cpp)
else()
  set(TDC_YAML_CPP yaml-cpp)
endif()

# tdc_deps: what every tdc target links (libtdc included): LibTorch, nlohmann-json, threads, fmt.
# tdc_test_deps adds GoogleTest, for the harness and what links it (test binaries, the CLI, the
# benchmarks): libtdc knows no test framework, and a program that links libtdc gets none.
# [Note: fmt compiled once] LibTorch's wheel ships fmt's headers and keeps its compiled fmt hidden
# inside libc10/libtorch, so tdc compiles fmt's non-template part itself: one TU, cmake/fmt.cpp,
# from the same headers. tdc was built with FMT_HEADER_ONLY before: every TU that included
# fmt/format.h then compiled all of format-inl.h, about 2.5 s of a 2-core machine's time per TU
# (docs/bench/build_time.md).
add_library(tdc_fmt STATIC ${CMAKE_CURRENT_LIST_DIR}/fmt.cpp)
target_include_directories(tdc_fmt SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
target_compile_options(tdc_fmt PRIVATE -fPIC)
set_target_properties(tdc_fmt PROPERTIES EXPORT_NAME fmt)

add_library(tdc_deps INTERFACE)
target_link_libraries(tdc_deps INTERFACE ${TORCH_LIBRARIES} nlohmann_json::nlohmann_json Threads::Threads tdc_fmt)
# [Note: libstdc++ before LibTorch] PyTorch 2.11's wheels export pieces of a static libstdc++ from
# libtorch.so (64 std::filesystem symbols among 148 of namespace std; 2.12 and 2.14 export 72 std
# symbols, 2.13's CPU wheel none). The dynamic linker binds every reference to the first library
# in load order that defines the symbol, and libstdc++.so.6 is normally the last DT_NEEDED, so
# tdc's std::filesystem::remove_all ran libtorch.so's copy, which jumps to address 0 (the SIGSEGV
# that killed whole test binaries against 2.11: the harness removes each test's temp dir). Every
# tdc binary and library therefore names libstdc++ first; CTest tdc_link_order checks it.
target_link_options(tdc_deps INTERFACE "LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")
target_compile_options(tdc_deps INTERFACE -fPIC -Wall -Wno-unused-parameter -Wno-sign-compare)

add_library(tdc_test_deps INTERFACE)
target_link_libraries(tdc_test_deps INTERFACE tdc_deps GTest::gtest GTest::gmock)
