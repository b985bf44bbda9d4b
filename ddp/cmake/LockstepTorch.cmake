# LibTorch for the CMake build: defines the INTERFACE target `lockstep_torch`
# (headers, libraries, the _GLIBCXX_USE_CXX11_ABI define) and sets
#   LOCKSTEP_TORCH_HAS_CUDA  TRUE when libtorch_cuda and libc10_cuda were found
#   LOCKSTEP_TORCH_VIA       CONFIG or MANUAL (how LibTorch was found)
#   LOCKSTEP_TORCH_LIB_DIR   the directory of libtorch.so
#   LOCKSTEP_TORCH_ABI       LibTorch's _GLIBCXX_USE_CXX11_ABI (0 or 1)
#
# Where LibTorch is looked for, first hit wins:
#   1. TORCH_ROOT (a directory holding include/ and lib/, e.g. the pip
#      package's site-packages/torch),
#   2. the torch package that LOCKSTEP_PYTHON can import,
#   3. CMake's default search (Debian: /usr/lib/x86_64-linux-gnu/cmake/Torch).
#
# How (LOCKSTEP_TORCH_FIND):
#   CONFIG  find_package(Torch): TorchConfig.cmake decides everything.
#   MANUAL  include directories and libraries located here; TorchConfig is
#           never read as CMake code.
#   AUTO    (default) configure a throwaway project that calls
#           find_package(Torch) in a child CMake; use CONFIG if it succeeds,
#           else MANUAL. A CUDA TorchConfig stops with a fatal error when it
#           dislikes the CUDA toolkit (no cuDNN, no NVTX, nvcc vs. host
#           compiler), and a fatal error cannot be caught in-process.

set(TORCH_ROOT "" CACHE PATH
    "LibTorch prefix holding include/ and lib/ (empty: ask python, then search)")
set(LOCKSTEP_TORCH_FIND "AUTO" CACHE STRING
    "How to find LibTorch: AUTO, CONFIG (find_package) or MANUAL")
set_property(CACHE LOCKSTEP_TORCH_FIND PROPERTY STRINGS AUTO CONFIG MANUAL)
set(LOCKSTEP_TORCH_CXX11_ABI "AUTO" CACHE STRING
    "_GLIBCXX_USE_CXX11_ABI of LibTorch in MANUAL mode: AUTO, 0 or 1")
set_property(CACHE LOCKSTEP_TORCH_CXX11_ABI PROPERTY STRINGS AUTO 0 1)

# ---- What python's torch package says (optional) ----
set(_lockstep_py_torch_root "")
set(_lockstep_py_torch_prefix "")
set(_lockstep_py_torch_abi "")
if(LOCKSTEP_PYTHON)
  execute_process(
    COMMAND "${LOCKSTEP_PYTHON}" -c
      "import os, torch, torch.utils; print('LOCKSTEP_TORCH', os.path.dirname(torch.__file__), torch.utils.cmake_prefix_path, int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__, sep='|')"
    RESULT_VARIABLE _rv
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _err)
  # Only the marked line: importing torch may print other things.
  string(REGEX MATCH "LOCKSTEP_TORCH\\|[^\n]*" _out "${_out}")
  if(_rv EQUAL 0 AND _out)
    string(REPLACE "|" ";" _out "${_out}")
    list(REMOVE_AT _out 0)
    list(GET _out 0 _lockstep_py_torch_root)
    list(GET _out 1 _lockstep_py_torch_prefix)
    list(GET _out 2 _lockstep_py_torch_abi)
    list(GET _out 3 _version)
    message(STATUS "LibTorch: python's torch ${_version} at ${_lockstep_py_torch_root}")
  else()
    string(REGEX REPLACE ".*\n([^\n]+)\n?$" "\\1" _err "${_err}")
    message(STATUS "LibTorch: ${LOCKSTEP_PYTHON} cannot import torch (${_err}); "
                   "using TORCH_ROOT or CMake's default search")
  endif()
endif()

if(TORCH_ROOT)
  set(_lockstep_torch_root "${TORCH_ROOT}")
  set(_lockstep_torch_prefix "${TORCH_ROOT}/share/cmake")
else()
  set(_lockstep_torch_root "${_lockstep_py_torch_root}")
  set(_lockstep_torch_prefix "${_lockstep_py_torch_prefix}")
endif()
if(_lockstep_torch_prefix)
  list(APPEND CMAKE_PREFIX_PATH "${_lockstep_torch_prefix}")
endif()

# ---- AUTO: probe find_package(Torch) in a child CMake ----
set(_lockstep_via "${LOCKSTEP_TORCH_FIND}")
if(_lockstep_via STREQUAL "AUTO")
  set(_probe_args
      "-DCMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH}"
      "-DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}"
      "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}")
  foreach(_var Torch_DIR CUDAToolkit_ROOT CMAKE_CUDA_COMPILER CMAKE_CUDA_ARCHITECTURES
               CUDA_TOOLKIT_ROOT_DIR TORCH_CUDA_ARCH_LIST CMAKE_MAKE_PROGRAM)
    if(DEFINED ${_var} AND NOT "${${_var}}" STREQUAL "")
      list(APPEND _probe_args "-D${_var}=${${_var}}")
    endif()
  endforeach()
  string(SHA1 _probe_key "${_probe_args}")
  if(NOT LOCKSTEP_TORCH_PROBE_KEY STREQUAL _probe_key)
    set(_probe_dir "${CMAKE_BINARY_DIR}/torch_probe")
    file(REMOVE_RECURSE "${_probe_dir}")
    message(STATUS "LibTorch: probing find_package(Torch) in ${_probe_dir}")
    execute_process(
      COMMAND "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/torch_probe"
              -B "${_probe_dir}" -G "${CMAKE_GENERATOR}" ${_probe_args}
      RESULT_VARIABLE _rv
      OUTPUT_VARIABLE _out
      ERROR_VARIABLE _err)
    if(_rv EQUAL 0)
      set(LOCKSTEP_TORCH_PROBE_RESULT "CONFIG" CACHE INTERNAL "")
    else()
      file(WRITE "${_probe_dir}/probe.log" "${_out}\n${_err}")
      string(LENGTH "${_err}" _len)
      if(_len GREATER 1500)
        math(EXPR _from "${_len} - 1500")
        string(SUBSTRING "${_err}" ${_from} -1 _err)
      endif()
      message(WARNING
        "LibTorch: find_package(Torch) fails here, so LibTorch is located by "
        "hand (LOCKSTEP_TORCH_FIND=MANUAL). Full log: ${_probe_dir}/probe.log. "
        "Its end:\n${_err}")
      set(LOCKSTEP_TORCH_PROBE_RESULT "MANUAL" CACHE INTERNAL "")
    endif()
    set(LOCKSTEP_TORCH_PROBE_KEY "${_probe_key}" CACHE INTERNAL "")
  endif()
  set(_lockstep_via "${LOCKSTEP_TORCH_PROBE_RESULT}")
endif()

add_library(lockstep_torch INTERFACE)
set(_lockstep_torch_lib_dir "")

if(_lockstep_via STREQUAL "CONFIG")
  find_package(Torch REQUIRED)
  target_link_libraries(lockstep_torch INTERFACE ${TORCH_LIBRARIES})
  get_filename_component(_lockstep_torch_lib_dir "${TORCH_LIBRARY}" DIRECTORY)
  set(_abi 1)
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
    set(_abi "${CMAKE_MATCH_1}")
  endif()
  message(STATUS "LibTorch: find_package(Torch) ${Torch_VERSION}: ${TORCH_LIBRARY}")
elseif(_lockstep_via STREQUAL "MANUAL")
  set(_hints "")
  if(_lockstep_torch_root)
    set(_hints HINTS "${_lockstep_torch_root}" NO_DEFAULT_PATH)
  endif()
  find_path(LOCKSTEP_TORCH_INCLUDE_DIR ATen/ATen.h ${_hints} PATH_SUFFIXES include)
  find_path(LOCKSTEP_TORCH_API_INCLUDE_DIR torch/torch.h ${_hints}
            PATH_SUFFIXES include/torch/csrc/api/include torch/csrc/api/include)
  find_library(LOCKSTEP_TORCH_LIBRARY torch ${_hints} PATH_SUFFIXES lib)
  find_library(LOCKSTEP_TORCH_CPU_LIBRARY torch_cpu ${_hints} PATH_SUFFIXES lib)
  find_library(LOCKSTEP_C10_LIBRARY c10 ${_hints} PATH_SUFFIXES lib)
  set(_missing "")
  foreach(_var LOCKSTEP_TORCH_INCLUDE_DIR LOCKSTEP_TORCH_API_INCLUDE_DIR LOCKSTEP_TORCH_LIBRARY
               LOCKSTEP_TORCH_CPU_LIBRARY LOCKSTEP_C10_LIBRARY)
    if(NOT ${_var})
      list(APPEND _missing ${_var})
    endif()
  endforeach()
  if(_missing)
    string(JOIN ", " _missing ${_missing})
    message(FATAL_ERROR
      "LibTorch not found (missing: ${_missing}). Looked in "
      "'${_lockstep_torch_root}' (TORCH_ROOT, else python's torch package) "
      "and the system paths. Install PyTorch for ${LOCKSTEP_PYTHON}, or pass "
      "-DTORCH_ROOT=<dir with include/ and lib/>.")
  endif()
  target_include_directories(lockstep_torch SYSTEM INTERFACE
    "${LOCKSTEP_TORCH_INCLUDE_DIR}" "${LOCKSTEP_TORCH_API_INCLUDE_DIR}")
  target_link_libraries(lockstep_torch INTERFACE
    "${LOCKSTEP_TORCH_LIBRARY}" "${LOCKSTEP_TORCH_CPU_LIBRARY}" "${LOCKSTEP_C10_LIBRARY}")
  get_filename_component(_lockstep_torch_lib_dir "${LOCKSTEP_TORCH_LIBRARY}" DIRECTORY)

  # The libstdc++ ABI must match LibTorch's: python says it; else the
  # TORCH_CXX_FLAGS line of the TorchConfig.cmake next to the libraries.
  set(_abi "${LOCKSTEP_TORCH_CXX11_ABI}")
  if(_abi STREQUAL "AUTO" AND NOT _lockstep_py_torch_abi STREQUAL ""
     AND _lockstep_torch_root STREQUAL _lockstep_py_torch_root)
    set(_abi "${_lockstep_py_torch_abi}")
  endif()
  if(_abi STREQUAL "AUTO")
    get_filename_component(_prefix "${LOCKSTEP_TORCH_INCLUDE_DIR}" DIRECTORY)
    foreach(_config "${_prefix}/share/cmake/Torch/TorchConfig.cmake"
                    "${_lockstep_torch_lib_dir}/cmake/Torch/TorchConfig.cmake")
      if(_abi STREQUAL "AUTO" AND EXISTS "${_config}")
        file(STRINGS "${_config}" _line REGEX "_GLIBCXX_USE_CXX11_ABI=[01]")
        if(_line MATCHES "_GLIBCXX_USE_CXX11_ABI=([01])")
          set(_abi "${CMAKE_MATCH_1}")
        endif()
      endif()
    endforeach()
  endif()
  if(_abi STREQUAL "AUTO")
    message(WARNING "LibTorch: cannot tell its _GLIBCXX_USE_CXX11_ABI; assuming 1 "
                    "(set LOCKSTEP_TORCH_CXX11_ABI to override)")
    set(_abi 1)
  endif()
  target_compile_definitions(lockstep_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_abi})
  message(STATUS "LibTorch: located by hand: ${LOCKSTEP_TORCH_LIBRARY} "
                 "(_GLIBCXX_USE_CXX11_ABI=${_abi})")
else()
  message(FATAL_ERROR "LOCKSTEP_TORCH_FIND must be AUTO, CONFIG or MANUAL, "
                      "not '${LOCKSTEP_TORCH_FIND}'")
endif()
set(LOCKSTEP_TORCH_VIA "${_lockstep_via}")
set(LOCKSTEP_TORCH_ABI "${_abi}")
set(LOCKSTEP_TORCH_LIB_DIR "${_lockstep_torch_lib_dir}")

# Libraries every binary must load even where it references none of their
# symbols: libtorch_cuda registers the CUDA backend from static initialisers
# only, so a linker running with --as-needed (Ubuntu's and Debian's default)
# drops it and torch::cuda::is_available() turns false. TorchConfig keeps
# libtorch and libtorch_cpu this way; MANUAL does the same.
set(_keep "")
if(_lockstep_via STREQUAL "MANUAL")
  list(APPEND _keep "${LOCKSTEP_TORCH_LIBRARY}" "${LOCKSTEP_TORCH_CPU_LIBRARY}")
endif()
set(LOCKSTEP_TORCH_HAS_CUDA FALSE)
if(EXISTS "${_lockstep_torch_lib_dir}/libtorch_cuda.so"
   AND EXISTS "${_lockstep_torch_lib_dir}/libc10_cuda.so")
  set(LOCKSTEP_TORCH_HAS_CUDA TRUE)
  list(APPEND _keep "${_lockstep_torch_lib_dir}/libtorch_cuda.so"
                    "${_lockstep_torch_lib_dir}/libc10_cuda.so")
endif()
if(_keep)
  # One comma-joined flag, so CMake neither reorders nor drops its parts; it
  # bypasses CMake's RPATH bookkeeping, hence the BUILD_RPATH entry.
  string(JOIN "," _keep ${_keep})
  target_link_libraries(lockstep_torch INTERFACE "-Wl,--push-state,--no-as-needed,${_keep},--pop-state")
  list(APPEND CMAKE_BUILD_RPATH "${_lockstep_torch_lib_dir}")
endif()
message(STATUS "LibTorch: CUDA libraries ${LOCKSTEP_TORCH_HAS_CUDA}")
