# Adds the fuzz targets to a distplan build without editing the top-level CMakeLists: the `fuzz`
# preset sets CMAKE_PROJECT_distplan_INCLUDE to this file, which CMake includes at the end of
# project(); the deferred call runs once the top-level directory is processed, when every library
# target exists. (Deferred calls cannot add subdirectories, so fuzz/CMakeLists.txt is included.)
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL _distplan_add_fuzz_targets)
function(_distplan_add_fuzz_targets)
  if(NOT TARGET scenario_fuzz)
    include(${CMAKE_SOURCE_DIR}/fuzz/CMakeLists.txt)
  endif()
endfunction()
