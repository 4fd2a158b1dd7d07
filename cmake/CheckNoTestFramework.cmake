# libtdc knows no test framework ([Note: libtdc's layering]): a program that links libtdc must not
# get GoogleTest with it. Fails when LIB needs a gtest/gmock library or defines GoogleTest's symbols.
#   cmake -DLIB=<shared library> -P CheckNoTestFramework.cmake
include(${CMAKE_CURRENT_LIST_DIR}/ElfInspect.cmake)
tdc_elf_require(LIB CheckNoTestFramework)
tdc_elf_needed("${LIB}" CheckNoTestFramework libs)
string(REGEX MATCHALL "[^;]*(gtest|gmock)[^;]*" needed "${libs}")
tdc_elf_defined_symbols("${LIB}" CheckNoTestFramework syms)
string(REGEX MATCHALL "[^\n]* testing::[^\n]*" defined "${syms}")
list(LENGTH defined n)
if(needed OR n GREATER 0)
  if(n GREATER 0)
    list(SUBLIST defined 0 3 first)
    string(REPLACE ";" "\n  " first "${first}")
  endif()
  message(FATAL_ERROR "CheckNoTestFramework: ${LIB} carries GoogleTest: ${needed} ${n} symbol(s) of testing::\n  ${first}")
endif()
message(STATUS "CheckNoTestFramework: ${LIB} needs and defines nothing of GoogleTest")
