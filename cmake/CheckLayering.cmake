# [Note: libtdc's layering] Which component of libtdc may include which (docs/architecture.md,
# "Layering"). A component is a folder impl/<name>/ with its public headers in
# impl/include/tdc/<name>/ (mesh's public header is tdc/device_mesh.h). `core` (tdc/core/, and
# the top-level tdc/libtorch_compat.h and tdc/implementation.h) is the base every component may
# use. An include is an edge from the including file's component to the included header's; every
# edge must be in the table below. Also refused anywhere under impl/: a relative include into
# another folder ("../x/..."), which reaches into another component's private files, and
# GoogleTest (libtdc knows no test framework). `tdc/json/` (json/: the one JSON reader, below libtdc
# and the harness) is open to every component, as a third-party header is.
#   cmake -DSOURCE=<repository root> -P CheckLayering.cmake    fails naming every violation
#
# The table (cmake/TdcComponents.cmake, which the build also makes its targets from): component,
# then the components it may include. Order is bottom-up; no edge points up, so there are no
# circles (except edges listed as tolerated, with what removes them).
cmake_minimum_required(VERSION 3.20)

include(${CMAKE_CURRENT_LIST_DIR}/TdcComponents.cmake)  # TDC_LAYERS: the table, shared with the build
# Edges that point up (a circle), each with what removes it, tolerated until then. The check fails
# when one is no longer used, so the table cannot go stale.
set(TDC_TOLERATED)  # "from|to|what removes it": none today

if(NOT SOURCE OR NOT EXISTS "${SOURCE}/impl")
  message(FATAL_ERROR "CheckLayering: SOURCE='${SOURCE}' is not the repository root")
endif()

set(allowed_core core)
set(components core)
foreach(row IN LISTS TDC_LAYERS)
  string(REPLACE "|" ";" parts "${row}")
  list(GET parts 0 c)
  list(LENGTH parts n)
  set(deps "")
  if(n GREATER 1)
    list(GET parts 1 deps)
    string(REPLACE " " ";" deps "${deps}")
  endif()
  set(allowed_${c} ${c} core ${deps})
  list(APPEND components ${c})
endforeach()
foreach(row IN LISTS TDC_TOLERATED)
  string(REPLACE "|" ";" parts "${row}")
  list(GET parts 0 from)
  list(GET parts 1 to)
  set(tolerated_${from}_${to} TRUE)
  set(used_${from}_${to} FALSE)
endforeach()

# The component a path under impl/ belongs to ("" for the implementation descriptor at the root).
function(component_of_file rel out)
  if(rel MATCHES "^include/tdc/([a-z0-9_]+)/")
    set(c "${CMAKE_MATCH_1}")
  elseif(rel STREQUAL "include/tdc/device_mesh.h")
    set(c mesh)
  elseif(rel MATCHES "^include/tdc/[a-z_]+\\.h$")
    set(c core)
  elseif(rel MATCHES "^([a-z0-9_]+)/")
    set(c "${CMAKE_MATCH_1}")
  else()
    set(c "")
  endif()
  set(${out} "${c}" PARENT_SCOPE)
endfunction()

function(component_of_include inc out)
  if(inc MATCHES "^tdc/json/")
    set(c "")  # tdc_json (json/): below libtdc and the harness, usable by every component
  elseif(inc MATCHES "^tdc/([a-z0-9_]+)/")
    set(c "${CMAKE_MATCH_1}")
  elseif(inc STREQUAL "tdc/device_mesh.h")
    set(c mesh)
  elseif(inc MATCHES "^tdc/[a-z_]+\\.h$")
    set(c core)
  else()
    set(c "")
  endif()
  set(${out} "${c}" PARENT_SCOPE)
endfunction()

set(errors "")
file(GLOB_RECURSE files RELATIVE "${SOURCE}/impl" "${SOURCE}/impl/*.h" "${SOURCE}/impl/*.cpp")
foreach(rel IN LISTS files)
  component_of_file("${rel}" from)
  if(from STREQUAL "")
    continue()  # impl/implementation.cpp: the descriptor names every component
  endif()
  if(NOT from IN_LIST components)
    string(APPEND errors "\n  impl/${rel}: folder '${from}' is not a component of the table in cmake/TdcComponents.cmake")
    continue()
  endif()
  file(STRINGS "${SOURCE}/impl/${rel}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "include[ \t]*[\"<]([^\">]+)[\">]")
      continue()
    endif()
    set(inc "${CMAKE_MATCH_1}")
    if(inc MATCHES "^\\.\\./")
      string(APPEND errors "\n  impl/${rel}: #include \"${inc}\" reaches into another folder's private files (include its public header tdc/...)")
      continue()
    endif()
    if(inc MATCHES "^(gtest|gmock)/")
      string(APPEND errors "\n  impl/${rel}: #include <${inc}>: libtdc knows no test framework")
      continue()
    endif()
    component_of_include("${inc}" to)
    if(to STREQUAL "" OR to IN_LIST allowed_${from})
      continue()
    endif()
    if(tolerated_${from}_${to})
      set(used_${from}_${to} TRUE)
      continue()
    endif()
    string(APPEND errors "\n  impl/${rel}: ${from} includes ${inc} (${to}); ${from} may include: ${allowed_${from}}")
  endforeach()
endforeach()

foreach(row IN LISTS TDC_TOLERATED)
  string(REPLACE "|" ";" parts "${row}")
  list(GET parts 0 from)
  list(GET parts 1 to)
  list(GET parts 2 why)
  if(used_${from}_${to})
    message(STATUS "CheckLayering: tolerated edge ${from} -> ${to}: ${why}")
  else()
    string(APPEND errors "\n  the tolerated edge ${from} -> ${to} is no longer used: remove it from TDC_TOLERATED")
  endif()
endforeach()

if(NOT errors STREQUAL "")
  message(FATAL_ERROR "CheckLayering: includes that cross libtdc's layering ([Note: libtdc's layering], cmake/CheckLayering.cmake):${errors}")
endif()
list(LENGTH files nfiles)
message(STATUS "CheckLayering: ${nfiles} files of impl/ follow the layering")
