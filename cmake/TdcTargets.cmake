# How tdc's folders declare their products: test binaries (listed
# in tdc_suites.json for `tdc run`) and the files the CLI reads from the build directory.

# Precompiled headers: two, shared by the targets that parse torch/nn/module.h anyway
# ([Note: two shared precompiled headers], cmake/TdcPch.cmake). Each TU still includes what it uses.

# ---------------------------------------------------------------- test binaries
# tdc_test_binary(name kind sources...): kind is unit, mustfail or conformance. Every binary is
# listed in tdc_suites.json; a unit binary is also one CTest entry (docs/decisions.md: one process
# per binary, not per test).
function(tdc_test_binary name kind)
  add_executable(${name} ${ARGN})
  # [Note: frames with file:line] line tables (-g1), so that a hang's or a crash's stack names
  # the test body's file:line.
  target_compile_options(${name} PRIVATE -g1)
  target_link_options(${name} PRIVATE -rdynamic)
  set_property(GLOBAL APPEND PROPERTY TDC_SUITES "${kind}:${name}")
  if(kind STREQUAL "unit")
    add_test(NAME ${name} COMMAND ${name})
  endif()
endfunction()

# A program that is not a test binary (benchmarks, examples): -rdynamic (stack traces).
function(tdc_program name)
  add_executable(${name} ${ARGN})
  target_link_options(${name} PRIVATE -rdynamic)
endfunction()

# ---------------------------------------------------------------- the CLI's refusals
# tdc_cli_refusal_tests(prefix "label|arg;arg;...|message" ...): one CTest entry prefix_label per
# case, running `tdc-cli ARGS --build-dir BUILD --out OUT`: it must exit 2 before anything runs,
# print MESSAGE (a grep pattern), and leave no results behind (no OUT/results.json, no file OUT).
function(tdc_cli_refusal_tests prefix)
  math(EXPR last "${ARGC} - 1")
  foreach(i RANGE 1 ${last})
    # ARGV<i>, not ARGN: a case's arguments are separated by ';', which ARGN would split apart.
    string(REPLACE "|" ";" parts "${ARGV${i}}")
    list(GET parts 0 label)
    list(GET parts -1 want)
    list(SUBLIST parts 1 -1 args)
    list(REMOVE_AT args -1)
    string(REPLACE ";" " " args "${args}")
    add_test(NAME ${prefix}_${label}
      COMMAND sh -c "out=$(\"$0\" ${args} --build-dir \"$1\" --out \"$2\" 2>&1); rc=$?; echo \"$out\"; \
[ $rc -eq 2 ] || { echo \"expected exit 2, got $rc\"; exit 1; }; \
echo \"$out\" | grep -q -e \"${want}\" || { echo \"message lacks: ${want}\"; exit 1; }; \
[ ! -e \"$2/results.json\" ] && [ ! -f \"$2\" ] || { echo 'results were written'; exit 1; }"
        $<TARGET_FILE:tdc-cli> ${CMAKE_BINARY_DIR} ${CMAKE_BINARY_DIR}/refused-${prefix}-${label})
  endforeach()
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
