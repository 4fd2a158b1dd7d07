# [Note: Gloo is created inside LibTorch] (impl/comm/backend_gloo.cpp): a library of tdc's must
# define no symbol of gloo's. LibTorch carries its own gloo; a gloo function or template
# instantiated from other headers (Debian's libgloo-dev) and exported from tdc's library could
# interpose on LibTorch's copy at run time, with another class layout.
#   cmake -DLIB=<shared library> -P CheckNoGloo.cmake    fails naming the symbols it finds
if(NOT LIB OR NOT EXISTS "${LIB}")
  message(FATAL_ERROR "CheckNoGloo: LIB='${LIB}' does not exist")
endif()
find_program(NM nm REQUIRED)
execute_process(COMMAND ${NM} -D --defined-only -C "${LIB}" OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "CheckNoGloo: nm failed on ${LIB} (exit ${rc})")
endif()
string(REGEX MATCHALL "[^\n]*gloo::[^\n]*" found "${syms}")
list(LENGTH found n)
if(n GREATER 0)
  list(SUBLIST found 0 5 first)
  string(REPLACE ";" "\n  " first "${first}")
  message(FATAL_ERROR "CheckNoGloo: ${LIB} defines ${n} symbol(s) of gloo's, e.g.\n  ${first}")
endif()
message(STATUS "CheckNoGloo: ${LIB} defines no symbol of gloo's")
