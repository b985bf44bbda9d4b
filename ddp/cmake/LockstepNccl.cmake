# CUDA runtime and NCCL for the CMake build. Sets LOCKSTEP_WITH_NCCL (TRUE or
# FALSE) and, when TRUE, defines the INTERFACE target `lockstep_nccl`
# (nccl.h, libnccl, CUDA::cudart).
#
# LOCKSTEP_NCCL: AUTO (default) builds the real NCCL communicator when the
# CUDA toolkit and NCCL are both found, ON fails the configure without them,
# OFF always builds the stub. NCCL is looked for in NCCL_INCLUDE_DIR +
# NCCL_LIBRARY if set, else in the first of these prefixes that holds both
# include/nccl.h and lib*/libnccl.so*: NCCL_ROOT, $NCCL_ROOT, $NCCL_HOME, the
# pip package (nvidia-nccl-cu*, under LOCKSTEP_PYTHON's `nvidia` namespace),
# the CUDA toolkit, /usr/local/cuda, /usr. Header and library come from one
# prefix so their versions agree; the pip copy comes before the toolkit's
# because it is the one LibTorch loads.

set(LOCKSTEP_NCCL "AUTO" CACHE STRING
    "NCCL communicator: AUTO (when CUDA and NCCL are found), ON (required) or OFF (stub)")
set_property(CACHE LOCKSTEP_NCCL PROPERTY STRINGS AUTO ON OFF)
set(NCCL_ROOT "" CACHE PATH "NCCL prefix with include/nccl.h and lib/libnccl.so*")
set(NCCL_INCLUDE_DIR "" CACHE PATH "Directory holding nccl.h (overrides the search)")
set(NCCL_LIBRARY "" CACHE FILEPATH "libnccl.so* to link (overrides the search)")

set(LOCKSTEP_WITH_NCCL FALSE)
if(LOCKSTEP_NCCL STREQUAL "AUTO")
  set(_nccl_required FALSE)
elseif(LOCKSTEP_NCCL)
  set(_nccl_required TRUE)
else()
  message(STATUS "NCCL: off (LOCKSTEP_NCCL=${LOCKSTEP_NCCL}); the NCCL communicator is the stub")
  return()
endif()

# Not finding NCCL is an error under ON, a warning when LibTorch has CUDA
# (a GPU build without NCCL is most likely a mistake), else a note.
macro(_lockstep_nccl_unavailable)
  string(CONCAT _reason ${ARGV})
  if(_nccl_required)
    message(FATAL_ERROR "LOCKSTEP_NCCL=ON but ${_reason}")
  elseif(LOCKSTEP_TORCH_HAS_CUDA)
    message(WARNING "NCCL communicator built as the stub: ${_reason} "
                    "(-DLOCKSTEP_NCCL=OFF silences this)")
  else()
    message(STATUS "NCCL: not built: ${_reason}")
  endif()
  return()
endmacro()

if(_nccl_required)
  find_package(CUDAToolkit)
else()
  find_package(CUDAToolkit QUIET)
endif()
if(NOT CUDAToolkit_FOUND)
  _lockstep_nccl_unavailable(
    "the CUDA toolkit was not found (looked for nvcc on PATH, $CUDA_PATH and "
    "/usr/local/cuda; pass -DCUDAToolkit_ROOT=<toolkit dir>)")
endif()

# A search result is cached; search again when NCCL_ROOT changes.
set(_search_key "NCCL_ROOT=${NCCL_ROOT}")
if(DEFINED LOCKSTEP_NCCL_SEARCH_KEY AND NOT LOCKSTEP_NCCL_SEARCH_KEY STREQUAL _search_key)
  set(NCCL_INCLUDE_DIR "" CACHE PATH "" FORCE)
  set(NCCL_LIBRARY "" CACHE FILEPATH "" FORCE)
  unset(LOCKSTEP_NCCL_SEARCH_KEY CACHE)
endif()

if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  set(_roots "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "$ENV{NCCL_HOME}")
  if(LOCKSTEP_PYTHON)
    # nvidia/ is a namespace package (no __file__): walk its __path__.
    execute_process(
      COMMAND "${LOCKSTEP_PYTHON}" -c [=[
import os
try:
    import nvidia
    paths = list(nvidia.__path__)
except Exception:
    paths = []
found = []
for p in paths:
    for sub in sorted(os.listdir(p), key=lambda s: (s != "nccl", s)):
        d = os.path.join(p, sub)
        if os.path.isfile(os.path.join(d, "include", "nccl.h")):
            found.append(d)
print(";".join(found))
]=]
      RESULT_VARIABLE _rv
      OUTPUT_VARIABLE _pip_roots
      ERROR_QUIET
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_rv EQUAL 0)
      list(APPEND _roots ${_pip_roots})
    endif()
  endif()
  foreach(_dir ${CUDAToolkit_INCLUDE_DIRS})
    get_filename_component(_parent "${_dir}" DIRECTORY)
    list(APPEND _roots "${_parent}")
  endforeach()
  get_filename_component(_parent "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
  list(APPEND _roots "${_parent}" /usr/local/cuda /usr)

  foreach(_root ${_roots})
    if(NOT _root OR NOT EXISTS "${_root}/include/nccl.h")
      continue()
    endif()
    foreach(_libdir lib lib64 lib/x86_64-linux-gnu)
      foreach(_name libnccl.so libnccl.so.2)
        if(NOT NCCL_LIBRARY AND EXISTS "${_root}/${_libdir}/${_name}")
          set(NCCL_INCLUDE_DIR "${_root}/include" CACHE PATH "" FORCE)
          set(NCCL_LIBRARY "${_root}/${_libdir}/${_name}" CACHE FILEPATH "" FORCE)
          set(LOCKSTEP_NCCL_SEARCH_KEY "${_search_key}" CACHE INTERNAL "")
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(NOT NCCL_LIBRARY)
    list(REMOVE_DUPLICATES _roots)
    list(REMOVE_ITEM _roots "")
    string(JOIN ", " _roots ${_roots})
    _lockstep_nccl_unavailable(
      "NCCL was not found: no prefix with include/nccl.h and lib*/libnccl.so* "
      "among: ${_roots}. Install nvidia-nccl-cu13 for ${LOCKSTEP_PYTHON}, or pass "
      "-DNCCL_ROOT=<prefix>.")
  endif()
endif()

if(NOT EXISTS "${NCCL_INCLUDE_DIR}/nccl.h" OR NOT EXISTS "${NCCL_LIBRARY}")
  _lockstep_nccl_unavailable(
    "NCCL_INCLUDE_DIR=${NCCL_INCLUDE_DIR} has no nccl.h or NCCL_LIBRARY=${NCCL_LIBRARY} "
    "does not exist")
endif()

file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
set(_nccl_version "")
foreach(_line ${_lines})
  if(_line MATCHES "NCCL_[A-Z]+ +([0-9]+)")
    string(APPEND _nccl_version ".${CMAKE_MATCH_1}")
  endif()
endforeach()
string(REGEX REPLACE "^\\." "" _nccl_version "${_nccl_version}")

add_library(lockstep_nccl INTERFACE)
target_include_directories(lockstep_nccl SYSTEM INTERFACE "${NCCL_INCLUDE_DIR}")
target_link_libraries(lockstep_nccl INTERFACE "${NCCL_LIBRARY}" CUDA::cudart)
get_filename_component(_nccl_lib_dir "${NCCL_LIBRARY}" DIRECTORY)
list(APPEND CMAKE_BUILD_RPATH "${_nccl_lib_dir}")
set(LOCKSTEP_WITH_NCCL TRUE)
message(STATUS "NCCL: ${_nccl_version} ${NCCL_LIBRARY} (headers ${NCCL_INCLUDE_DIR}); "
               "CUDA ${CUDAToolkit_VERSION} runtime ${CUDAToolkit_LIBRARY_DIR}")
