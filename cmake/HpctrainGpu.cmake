# Detects the CUDA toolkit, cuDNN and NCCL according to HPCTRAIN_CUDA/CUDNN/NCCL (AUTO|ON|OFF).
# Sets HPCTRAIN_HAVE_CUDA, HPCTRAIN_HAVE_CUDNN, HPCTRAIN_HAVE_NCCL. A missing piece is an error
# only when it was asked for with ON; with AUTO the build quietly becomes CPU-only.
include(CheckLanguage)

set(HPCTRAIN_HAVE_CUDA OFF)
set(HPCTRAIN_HAVE_CUDNN OFF)
set(HPCTRAIN_HAVE_NCCL OFF)

if(NOT HPCTRAIN_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Ampere (A100, g5's A10G is sm_86 and runs sm_80 code) and Hopper, plus PTX for later GPUs.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual)
    endif()
    enable_language(CUDA)
    # The kernels include src/core headers, which are C++20. CMake 3.25 predates nvcc 13 and
    # does not know its C++20 flag, so it is named here.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(HPCTRAIN_HAVE_CUDA ON)
  elseif(HPCTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "HPCTRAIN_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

function(hpctrain_find_gpu_lib option header lib outvar)
  if(NOT HPCTRAIN_HAVE_CUDA OR ${option} STREQUAL "OFF")
    if(${option} STREQUAL "ON")
      message(FATAL_ERROR "${option}=ON needs the CUDA toolkit")
    endif()
    return()
  endif()
  find_path(${outvar}_INCLUDE ${header} HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(${outvar}_LIBRARY ${lib} HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(${outvar}_INCLUDE AND ${outvar}_LIBRARY)
    set(${outvar} ON PARENT_SCOPE)
  elseif(${option} STREQUAL "ON")
    message(FATAL_ERROR "${option}=ON but ${header}/${lib} were not found")
  endif()
endfunction()

hpctrain_find_gpu_lib(HPCTRAIN_CUDNN cudnn.h cudnn HPCTRAIN_HAVE_CUDNN)
hpctrain_find_gpu_lib(HPCTRAIN_NCCL nccl.h nccl HPCTRAIN_HAVE_NCCL)

# cuDNN's major version: NVIDIA's package of it is named by it (libcudnn9-cuda-13).
if(HPCTRAIN_HAVE_CUDNN)
  file(STRINGS ${HPCTRAIN_HAVE_CUDNN_INCLUDE}/cudnn_version.h cudnn_major REGEX "^#define CUDNN_MAJOR [0-9]+")
  string(REGEX REPLACE "^#define CUDNN_MAJOR ([0-9]+).*" "\\1" HPCTRAIN_CUDNN_MAJOR "${cudnn_major}")
  if(NOT HPCTRAIN_CUDNN_MAJOR MATCHES "^[0-9]+$")
    message(FATAL_ERROR "no CUDNN_MAJOR in ${HPCTRAIN_HAVE_CUDNN_INCLUDE}/cudnn_version.h")
  endif()
endif()
