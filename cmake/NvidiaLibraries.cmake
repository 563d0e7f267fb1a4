# cuBLAS, cuBLASLt and NCCL for the CUDA device, as the targets distplan::cublas,
# distplan::cublasLt and (when found) nccl::nccl. Sources in order:
#   1. DISTPLAN_NVIDIA_WHEELS, when set: the site-packages/nvidia folder of NVIDIA's Python wheels
#      (nvidia-cublas: cu13/{include,lib}, CUDA 12 wheels: cublas/{include,lib};
#      nvidia-nccl-cu12/13: nccl/{include,lib}), which then wins over the toolkit;
#   2. the CUDA toolkit (FindCUDAToolkit's CUDA::cublas, CUDA::cublasLt; nccl.h beside it);
#   3. the wheels of the Python interpreter (python3 -c 'import nvidia'), for what 2 lacks.
# The wheels ship versioned names only (libcublas.so.13, libnccl.so.2), so those are searched too.
set(DISTPLAN_NVIDIA_WHEELS "" CACHE PATH
    "site-packages/nvidia of NVIDIA's wheels: cuBLAS and NCCL from there (else the toolkit, else python3's wheels)")

# Found paths are cached; forget them when the wheel folder changes or a cached file is gone (a
# temporary wheel folder of an earlier configure).
set(_distplan_found_vars DISTPLAN_CUBLAS_LIBRARY DISTPLAN_CUBLAS_INCLUDE_DIR
    DISTPLAN_CUBLASLT_LIBRARY DISTPLAN_CUBLASLT_INCLUDE_DIR NCCL_LIBRARY NCCL_INCLUDE_DIR)
foreach(v ${_distplan_found_vars})
  if(NOT "${DISTPLAN_NVIDIA_WHEELS}" STREQUAL "${_DISTPLAN_NVIDIA_WHEELS_LAST}"
     OR (${v} AND NOT EXISTS "${${v}}"))
    unset(${v} CACHE)
  endif()
endforeach()
set(_DISTPLAN_NVIDIA_WHEELS_LAST "${DISTPLAN_NVIDIA_WHEELS}" CACHE INTERNAL "")

function(_distplan_python_wheel_roots out)
  set(py "${Python_EXECUTABLE}")
  if(NOT py)
    find_program(DISTPLAN_PYTHON3 NAMES python3 python)
    set(py "${DISTPLAN_PYTHON3}")
  endif()
  set(roots "")
  if(py)
    execute_process(
      COMMAND ${py} -c "import importlib.util as u; s = u.find_spec('nvidia'); print(';'.join(s.submodule_search_locations) if s else '')"
      OUTPUT_VARIABLE roots OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(${out} "${roots}" PARENT_SCOPE)
endfunction()

# _distplan_find_in_wheels(<prefix> <header> <subdirs> <names...>): sets <prefix>_LIBRARY and
# <prefix>_INCLUDE_DIR (cache) from the first wheel root that has both.
function(_distplan_find_in_wheels prefix header subdirs roots)
  set(names ${ARGN})
  set(lib_hints "")
  set(inc_hints "")
  foreach(root ${roots})
    foreach(sub ${subdirs})
      list(APPEND lib_hints ${root}/${sub}/lib)
      list(APPEND inc_hints ${root}/${sub}/include)
    endforeach()
  endforeach()
  find_library(${prefix}_LIBRARY NAMES ${names} PATHS ${lib_hints} NO_DEFAULT_PATH)
  find_path(${prefix}_INCLUDE_DIR ${header} PATHS ${inc_hints} NO_DEFAULT_PATH)
endfunction()

function(_distplan_imported name lib inc)
  add_library(${name} SHARED IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES IMPORTED_LOCATION ${lib}
                                           INTERFACE_INCLUDE_DIRECTORIES ${inc})
endfunction()

set(_wheel_roots "")
if(DISTPLAN_NVIDIA_WHEELS)
  set(_wheel_roots ${DISTPLAN_NVIDIA_WHEELS})
elseif(NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cublasLt)
  _distplan_python_wheel_roots(_wheel_roots)
endif()

# cuBLAS and cuBLASLt
if(_wheel_roots AND (DISTPLAN_NVIDIA_WHEELS OR NOT TARGET CUDA::cublas))
  _distplan_find_in_wheels(DISTPLAN_CUBLAS cublas_v2.h "cu13;cublas" "${_wheel_roots}"
                           cublas libcublas.so.13 libcublas.so.12)
  _distplan_find_in_wheels(DISTPLAN_CUBLASLT cublasLt.h "cu13;cublas" "${_wheel_roots}"
                           cublasLt libcublasLt.so.13 libcublasLt.so.12)
endif()
if(DISTPLAN_CUBLAS_LIBRARY AND DISTPLAN_CUBLAS_INCLUDE_DIR AND DISTPLAN_CUBLASLT_LIBRARY)
  _distplan_imported(distplan::cublasLt ${DISTPLAN_CUBLASLT_LIBRARY} ${DISTPLAN_CUBLAS_INCLUDE_DIR})
  _distplan_imported(distplan::cublas ${DISTPLAN_CUBLAS_LIBRARY} ${DISTPLAN_CUBLAS_INCLUDE_DIR})
  set_target_properties(distplan::cublas PROPERTIES INTERFACE_LINK_LIBRARIES distplan::cublasLt)
  set(_cublas_from "wheels: ${DISTPLAN_CUBLAS_LIBRARY}")
elseif(TARGET CUDA::cublas AND TARGET CUDA::cublasLt)
  add_library(distplan::cublas INTERFACE IMPORTED GLOBAL)
  set_target_properties(distplan::cublas PROPERTIES INTERFACE_LINK_LIBRARIES CUDA::cublas)
  add_library(distplan::cublasLt INTERFACE IMPORTED GLOBAL)
  set_target_properties(distplan::cublasLt PROPERTIES INTERFACE_LINK_LIBRARIES CUDA::cublasLt)
  set(_cublas_from "toolkit: ${CUDAToolkit_LIBRARY_DIR}")
else()
  message(FATAL_ERROR "cuBLAS not found: not in the CUDA toolkit (${CUDAToolkit_LIBRARY_DIR}) nor in "
                      "NVIDIA's wheels (${_wheel_roots}); pip install nvidia-cublas or set DISTPLAN_NVIDIA_WHEELS")
endif()

# NCCL
if(NOT DISTPLAN_NVIDIA_WHEELS)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    if(NOT _wheel_roots)
      _distplan_python_wheel_roots(_wheel_roots)
    endif()
    unset(NCCL_INCLUDE_DIR CACHE)
    unset(NCCL_LIBRARY CACHE)
  endif()
endif()
if(_wheel_roots AND NOT (NCCL_INCLUDE_DIR AND NCCL_LIBRARY))
  _distplan_find_in_wheels(NCCL nccl.h "nccl" "${_wheel_roots}" nccl libnccl.so.2)
endif()
set(_nccl_from "not found")
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  _distplan_imported(nccl::nccl ${NCCL_LIBRARY} ${NCCL_INCLUDE_DIR})
  set(_nccl_from ${NCCL_LIBRARY})
endif()
message(STATUS "distplan: cuBLAS from ${_cublas_from}; NCCL ${_nccl_from}")
