# The dependency bundle (scripts/gpu_bundle.sh): header-only Eigen, nlohmann/json, CLI11 and fmt
# (FMT_HEADER_ONLY) plus GoogleTest built from its sources, as the imported targets find_package
# would give. Used instead of find_package when DISTPLAN_BUNDLE_DIR is set, so a bare CUDA
# container (no package manager, no Debian dev packages) builds the backend and its tests.
if(NOT EXISTS ${DISTPLAN_BUNDLE_DIR}/include/nlohmann/json.hpp)
  message(FATAL_ERROR "DISTPLAN_BUNDLE_DIR=${DISTPLAN_BUNDLE_DIR} holds no bundle: run scripts/gpu_bundle.sh")
endif()
set(_bundle_include ${DISTPLAN_BUNDLE_DIR}/include)
foreach(target nlohmann_json::nlohmann_json fmt::fmt CLI11::CLI11 Eigen3::Eigen)
  add_library(${target} INTERFACE IMPORTED)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${_bundle_include})
endforeach()
set_target_properties(fmt::fmt PROPERTIES INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
set(nlohmann_json_FOUND ON)
set(fmt_FOUND ON)
set(CLI11_FOUND ON)
set(Eigen3_FOUND ON)

# GoogleTest from source (googletest only, nothing installed); its targets are GTest::gtest and
# GTest::gtest_main as FindGTest names them.
if(DISTPLAN_BUILD_TESTS)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory(${DISTPLAN_BUNDLE_DIR}/googletest ${CMAKE_BINARY_DIR}/_bundle_googletest
                   EXCLUDE_FROM_ALL SYSTEM)
  foreach(lib gtest gtest_main)
    if(NOT TARGET GTest::${lib})
      add_library(GTest::${lib} ALIAS ${lib})
    endif()
  endforeach()
  set(GTest_FOUND ON)
endif()
message(STATUS "distplan: dependencies from the bundle ${DISTPLAN_BUNDLE_DIR}")
