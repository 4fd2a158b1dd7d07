# Third-party dependencies, gathered into one interface target: tdc_deps.
find_package(Torch REQUIRED)
find_package(GTest REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Threads REQUIRED)

# LibTorch's wheel ships fmt headers but no gloo headers. fmt is used header-only from the
# LibTorch copy so that one fmt version lives in the process (docs/decisions.md).
find_path(TDC_GLOO_INCLUDE_DIR gloo/algorithm.h
  HINTS ${TORCH_INSTALL_PREFIX}/include /usr/include
  DOC "gloo headers (Debian: libgloo-dev)")
if(NOT TDC_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "gloo headers not found: install Debian's libgloo-dev (./tdc does this)")
endif()

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

add_library(tdc_deps INTERFACE)
target_link_libraries(tdc_deps INTERFACE ${TORCH_LIBRARIES} GTest::gtest GTest::gmock
  nlohmann_json::nlohmann_json Threads::Threads)
target_compile_definitions(tdc_deps INTERFACE FMT_HEADER_ONLY=1)
target_compile_options(tdc_deps INTERFACE -fPIC -Wall -Wno-unused-parameter -Wno-sign-compare)
