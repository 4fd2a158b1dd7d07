# What a binary needs and exports, for the CTest scripts that check tdc's libraries
# (CheckLinkOrder, CheckNoGloo, CheckNoTestFramework). `who` names the caller in errors.
#   tdc_elf_require(VAR who): fails unless the variable VAR (-DVAR=...) names an existing file.
#   tdc_elf_needed(FILE who OUT): the DT_NEEDED names, in order.
#   tdc_elf_defined_symbols(FILE who OUT): `nm -D --defined-only -C` output, one symbol a line.
function(tdc_elf_require var who)
  if(NOT ${var} OR NOT EXISTS "${${var}}")
    message(FATAL_ERROR "${who}: ${var}='${${var}}' does not exist")
  endif()
endfunction()

function(tdc_elf_needed file who out)
  find_program(READELF readelf REQUIRED)
  execute_process(COMMAND ${READELF} -d "${file}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${who}: readelf failed on ${file} (exit ${rc})")
  endif()
  string(REGEX MATCHALL "Shared library: \\[[^]]+\\]" entries "${dyn}")
  set(names "")
  foreach(entry IN LISTS entries)
    string(REGEX REPLACE "Shared library: \\[([^]]+)\\]" "\\1" lib "${entry}")
    list(APPEND names "${lib}")
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

function(tdc_elf_defined_symbols file who out)
  find_program(NM nm REQUIRED)
  execute_process(COMMAND ${NM} -D --defined-only -C "${file}" OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${who}: nm failed on ${file} (exit ${rc})")
  endif()
  set(${out} "${syms}" PARENT_SCOPE)
endfunction()
