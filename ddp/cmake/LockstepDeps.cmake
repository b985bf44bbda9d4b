# Abseil and GoogleTest for the CMake build. Defines the INTERFACE targets
#   lockstep_absl        Abseil (status, strings, str_format, synchronization, ...)
#   lockstep_gtest_main  GoogleTest + gMock + gtest's main()
#
# Installed packages (abslConfig.cmake, GTestConfig.cmake) win when
# LOCKSTEP_USE_SYSTEM_DEPS is ON; otherwise, or when they are missing, the
# prefix LOCKSTEP_DEPS_PREFIX is used: include/{absl,gtest,gmock} and
# lib/lib{absl_*,gtest,gtest_main,gmock}.a as tools/gpu/pack_deps.sh writes
# them (Debian bookworm's static libraries, built with GCC 12 and the C++11
# ABI, inline namespace absl::debian3).

option(LOCKSTEP_USE_SYSTEM_DEPS
       "Use installed abseil/GoogleTest CMake packages before LOCKSTEP_DEPS_PREFIX" ON)
set(LOCKSTEP_DEPS_PREFIX "${LOCKSTEP_ROOT}/.gpudeps" CACHE PATH
    "Prefix with include/ and lib/ for abseil and GoogleTest (tools/gpu/pack_deps.sh)")

set(_lockstep_system_note "")
if(NOT LOCKSTEP_USE_SYSTEM_DEPS)
  set(_lockstep_system_note " (not looked for: LOCKSTEP_USE_SYSTEM_DEPS=OFF)")
endif()
set(_lockstep_pack_hint
    "Run tools/gpu/pack_deps.sh on a Debian bookworm machine with libabsl-dev, "
    "libgtest-dev and libgmock-dev, copy the resulting .gpudeps/ into the repo "
    "root here, or point -DLOCKSTEP_DEPS_PREFIX at such a folder.")

# ---- Abseil ----
add_library(lockstep_absl INTERFACE)
set(LOCKSTEP_ABSL_FROM "")
if(LOCKSTEP_USE_SYSTEM_DEPS)
  find_package(absl CONFIG QUIET)
endif()
if(LOCKSTEP_USE_SYSTEM_DEPS AND absl_FOUND)
  target_link_libraries(lockstep_absl INTERFACE
    absl::status absl::statusor absl::strings absl::str_format absl::synchronization
    absl::time absl::flat_hash_map absl::hash)
  set(LOCKSTEP_ABSL_FROM "${absl_DIR}")
else()
  file(GLOB _absl_libs "${LOCKSTEP_DEPS_PREFIX}/lib/libabsl_*.a")
  if(NOT EXISTS "${LOCKSTEP_DEPS_PREFIX}/include/absl/status/status.h" OR NOT _absl_libs)
    message(FATAL_ERROR
      "Abseil not found: no installed abslConfig.cmake"
      "${_lockstep_system_note} and no "
      "${LOCKSTEP_DEPS_PREFIX}/include/absl/status/status.h with "
      "${LOCKSTEP_DEPS_PREFIX}/lib/libabsl_*.a. " ${_lockstep_pack_hint})
  endif()
  # The archives depend on one another in an order nobody wants to maintain:
  # hand them to the linker as one group, which it rescans until nothing new
  # resolves. One comma-joined flag, so CMake neither reorders nor dedups it.
  string(JOIN "," _absl_group ${_absl_libs})
  if(LOCKSTEP_DEPS_PREFIX MATCHES "[ ,]")
    message(FATAL_ERROR "LOCKSTEP_DEPS_PREFIX must not contain spaces or commas: ${LOCKSTEP_DEPS_PREFIX}")
  endif()
  target_include_directories(lockstep_absl SYSTEM INTERFACE "${LOCKSTEP_DEPS_PREFIX}/include")
  target_link_libraries(lockstep_absl INTERFACE
    "-Wl,--start-group,${_absl_group},--end-group" Threads::Threads)
  list(LENGTH _absl_libs _count)
  set(LOCKSTEP_ABSL_FROM "${LOCKSTEP_DEPS_PREFIX} (${_count} static archives)")
endif()
message(STATUS "Abseil: ${LOCKSTEP_ABSL_FROM}")

# ---- GoogleTest / gMock (only for the tests) ----
add_library(lockstep_gtest_main INTERFACE)
set(LOCKSTEP_GTEST_FROM "not needed (LOCKSTEP_BUILD_TESTS=OFF)")
if(NOT LOCKSTEP_BUILD_TESTS)
  return()
endif()
set(LOCKSTEP_GTEST_FROM "")
if(LOCKSTEP_USE_SYSTEM_DEPS)
  find_package(GTest CONFIG QUIET)
endif()
if(LOCKSTEP_USE_SYSTEM_DEPS AND GTest_FOUND AND TARGET GTest::gmock AND TARGET GTest::gtest_main)
  target_link_libraries(lockstep_gtest_main INTERFACE GTest::gmock GTest::gtest_main)
  set(LOCKSTEP_GTEST_FROM "${GTest_DIR}")
else()
  set(_gtest_missing "")
  foreach(_file include/gtest/gtest.h include/gmock/gmock.h
                lib/libgtest.a lib/libgtest_main.a lib/libgmock.a)
    if(NOT EXISTS "${LOCKSTEP_DEPS_PREFIX}/${_file}")
      list(APPEND _gtest_missing "${LOCKSTEP_DEPS_PREFIX}/${_file}")
    endif()
  endforeach()
  if(_gtest_missing)
    message(FATAL_ERROR
      "GoogleTest not found: no installed GTestConfig.cmake with gmock"
      "${_lockstep_system_note}, and "
      "missing ${_gtest_missing}. " ${_lockstep_pack_hint})
  endif()
  foreach(_lib gtest gtest_main gmock)
    add_library(lockstep_dep_${_lib} STATIC IMPORTED)
    set_target_properties(lockstep_dep_${_lib} PROPERTIES
      IMPORTED_LOCATION "${LOCKSTEP_DEPS_PREFIX}/lib/lib${_lib}.a")
  endforeach()
  set_target_properties(lockstep_dep_gtest PROPERTIES INTERFACE_LINK_LIBRARIES Threads::Threads)
  set_target_properties(lockstep_dep_gtest_main lockstep_dep_gmock PROPERTIES
    INTERFACE_LINK_LIBRARIES lockstep_dep_gtest)
  target_include_directories(lockstep_gtest_main SYSTEM INTERFACE "${LOCKSTEP_DEPS_PREFIX}/include")
  target_link_libraries(lockstep_gtest_main INTERFACE lockstep_dep_gmock lockstep_dep_gtest_main)
  set(LOCKSTEP_GTEST_FROM "${LOCKSTEP_DEPS_PREFIX}")
endif()
message(STATUS "GoogleTest: ${LOCKSTEP_GTEST_FROM}")
