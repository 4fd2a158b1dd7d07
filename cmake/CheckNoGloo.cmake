# [Note: Gloo is created inside LibTorch] (impl/comm/backend_gloo.cpp): a library of tdc's must
# define no symbol of gloo's. LibTorch carries its own gloo; a gloo function or template
# instantiated from other headers (Debian's libgloo-dev) and exported from tdc's library could
# interpose on LibTorch's copy at run time, with another class layout.
#   cmake -DLIB=<shared library> -P CheckNoGloo.cmake    fails naming the symbols it finds
include(${CMAKE_CURRENT_LIST_DIR}/ElfInspect.cmake)
tdc_elf_require(LIB CheckNoGloo)
tdc_elf_defined_symbols("${LIB}" CheckNoGloo syms)
string(REGEX MATCHALL "[^\n]*gloo::[^\n]*" found "${syms}")
list(LENGTH found n)
if(n GREATER 0)
  list(SUBLIST found 0 5 first)
  string(REPLACE ";" "\n  " first "${first}")
  message(FATAL_ERROR "CheckNoGloo: ${LIB} defines ${n} symbol(s) of gloo's, e.g.\n  ${first}")
endif()
message(STATUS "CheckNoGloo: ${LIB} defines no symbol of gloo's")
