# How tdc's folders declare their products: the shared precompiled header, test binaries (listed
# in tdc_suites.json for `tdc run`) and the files the CLI reads from the build directory.

# ---------------------------------------------------------------- the shared PCH
# LibTorch, c10d, fmt, nlohmann-json: no GoogleTest (libtdc uses it too, and knows no test
# framework). Test TUs include gtest.h themselves; GoogleTest's GTEST_HAS_PTHREAD definition on
# their command line does not invalidate the PCH, which has nothing of gtest's.
add_library(tdc_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/pch.cpp)
target_link_libraries(tdc_pch PUBLIC tdc_deps)
# [Note: frames with file:line] Test binaries carry line tables (-g1) so that a hang's or a
# crash's stack names the test body's file:line. GCC uses a PCH built with debug info in TUs
# with or without -g (not the other way round), so the one PCH is built with -g1 and libtdc's
# TUs, built without -g, still use it.
target_compile_options(tdc_pch PRIVATE -g1)
target_precompile_headers(tdc_pch PRIVATE ${CMAKE_CURRENT_LIST_DIR}/pch.h)
function(tdc_use_pch target)
  target_precompile_headers(${target} REUSE_FROM tdc_pch)
endfunction()

# ---------------------------------------------------------------- test binaries
# tdc_test_binary(name kind sources...): kind is unit, mustfail or conformance. Every binary is
# listed in tdc_suites.json; a unit binary is also one CTest entry (docs/decisions.md: one process
# per binary, not per test).
function(tdc_test_binary name kind)
  add_executable(${name} ${ARGN})
  tdc_use_pch(${name})
  target_compile_options(${name} PRIVATE -g1)  # [Note: frames with file:line]
  target_link_options(${name} PRIVATE -rdynamic)
  set_property(GLOBAL APPEND PROPERTY TDC_SUITES "${kind}:${name}")
  if(kind STREQUAL "unit")
    add_test(NAME ${name} COMMAND ${name})
  endif()
endfunction()

# A program that is not a test binary (benchmarks, examples): same PCH and -rdynamic (stack traces).
function(tdc_program name)
  add_executable(${name} ${ARGN})
  tdc_use_pch(${name})
  target_link_options(${name} PRIVATE -rdynamic)
endfunction()

# ---------------------------------------------------------------- files the CLI reads
function(tdc_write_build_manifests)
  get_property(suites GLOBAL PROPERTY TDC_SUITES)
  set(manifest "[")
  set(sep "")
  foreach(entry IN LISTS suites)
    string(REPLACE ":" ";" parts "${entry}")
    list(GET parts 0 kind)
    list(GET parts 1 bin)
    string(APPEND manifest "${sep}{\"kind\":\"${kind}\",\"binary\":\"$<TARGET_FILE:${bin}>\"}")
    set(sep ",")
  endforeach()
  string(APPEND manifest "]")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/tdc_suites.json CONTENT "${manifest}\n")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/tdc_build_info.json CONTENT
    "{\"example_backend_lib\":\"$<TARGET_FILE:tdc_example_backend>\",\"torch_version\":\"${Torch_VERSION}\",\
\"torch_cuda\":\"${TDC_TORCH_CUDA}\",\"nccl_version\":\"${TDC_NCCL_VERSION}\",\"compiler\":\"${TDC_COMPILER}\",\
\"torch_prefix\":\"${TORCH_INSTALL_PREFIX}\"}\n")
endfunction()
