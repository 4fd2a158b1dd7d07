# [Note: tdc as a CMake package] `cmake --install BUILD --prefix P` installs what a project outside
# tdc's tree builds its tests and plug-ins with: libtdc (tdc::tdc), the harness (tdc::harness,
# tdc::harness_main: main() of a test binary) and the conformance support library
# (tdc::conformance: world(), the checks), their public headers, and P/lib/cmake/tdc, so that
# `find_package(tdc)` with P (and LibTorch's prefix) on CMAKE_PREFIX_PATH gives those targets.
# The package is tied to the LibTorch it was built with (C++ ABI): tdcConfig.cmake finds Torch at
# the Torch_DIR of tdc's build first. examples/outside/ is such a project; CTest
# `tdc_outside_project` installs, builds it and runs its test with `tdc run --binary`.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(tdc_harness PROPERTIES EXPORT_NAME harness)
set_target_properties(tdc_harness_main PROPERTIES EXPORT_NAME harness_main)
set_target_properties(tdc_conformance_support PROPERTIES EXPORT_NAME conformance)
set_target_properties(tdc_deps PROPERTIES EXPORT_NAME deps)
set_target_properties(tdc_test_deps PROPERTIES EXPORT_NAME test_deps)
install(TARGETS tdc tdc_fmt tdc_deps tdc_test_deps tdc_harness tdc_harness_main tdc_conformance_support
  EXPORT tdcTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY impl/include/ harness/include/ conformance/support/include/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT tdcTargets NAMESPACE tdc:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdc)
configure_package_config_file(cmake/tdcConfig.cmake.in ${CMAKE_BINARY_DIR}/tdcConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdc)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/tdcConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/tdcConfig.cmake ${CMAKE_BINARY_DIR}/tdcConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tdc)
