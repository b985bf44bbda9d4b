# What a worker needs to run under lockstepd, beyond the DDP core: gRPC and
# Protocol Buffers (the store client and the progress reporter), spdlog
# (logs), OpenSSL (the workers' mutual TLS) and Gloo (the CPU
# communicator). Sets
#   LOCKSTEP_WITH_RUNTIME  TRUE when the worker library (InitFromEnv, the
#                          gRPC store, progress) can be built
#   LOCKSTEP_WITH_GLOO     TRUE when Gloo was found (else GlooCommunicator
#                          and the hierarchical one return Unimplemented)
#   LOCKSTEP_RUNTIME_FROM  what was found, for the summary
# and, when LOCKSTEP_WITH_RUNTIME, the INTERFACE targets lockstep_grpc
# (gRPC++, its reflection plugin, protobuf), lockstep_spdlog, and
# lockstep_gloo (when found), plus LOCKSTEP_PROTOC and
# LOCKSTEP_GRPC_CPP_PLUGIN.
#
# LOCKSTEP_RUNTIME: AUTO (default) builds the worker library when its
# dependencies are found, ON fails the configure without them, OFF builds
# only the DDP core (what the GPU tests need). The dependencies are the
# installed CMake packages gRPC, spdlog (Debian: libgrpc++-dev,
# protobuf-compiler-grpc, libspdlog-dev), protobuf (FindProtobuf) and
# OpenSSL (FindOpenSSL; Debian: libssl-dev).
# LOCKSTEP_GLOO: AUTO (default: Gloo when its headers and library are
# found: GLOO_ROOT, then the system, Debian's libgloo-dev), ON (required),
# OFF.

set(LOCKSTEP_RUNTIME "AUTO" CACHE STRING
    "Worker library (InitFromEnv, gRPC store, progress): AUTO, ON (required) or OFF")
set_property(CACHE LOCKSTEP_RUNTIME PROPERTY STRINGS AUTO ON OFF)
set(LOCKSTEP_GLOO "AUTO" CACHE STRING "Gloo communicator: AUTO, ON (required) or OFF")
set_property(CACHE LOCKSTEP_GLOO PROPERTY STRINGS AUTO ON OFF)
set(GLOO_ROOT "" CACHE PATH "Gloo prefix with include/gloo/ and lib/libgloo.so")

set(LOCKSTEP_WITH_RUNTIME FALSE)
set(LOCKSTEP_WITH_GLOO FALSE)
set(LOCKSTEP_RUNTIME_FROM "off (LOCKSTEP_RUNTIME=${LOCKSTEP_RUNTIME})")
if(NOT LOCKSTEP_RUNTIME STREQUAL "AUTO" AND NOT LOCKSTEP_RUNTIME)
  message(STATUS "Worker library: off (LOCKSTEP_RUNTIME=${LOCKSTEP_RUNTIME}): only the DDP core")
  return()
endif()

find_package(gRPC CONFIG QUIET)
find_package(Protobuf QUIET)
find_package(spdlog CONFIG QUIET)
# rendezvous/tls.cc and common/certs.cc: the workers' mutual TLS.
find_package(OpenSSL QUIET)
set(_missing "")
if(NOT gRPC_FOUND OR NOT TARGET gRPC::grpc++ OR NOT TARGET gRPC::grpc_cpp_plugin)
  list(APPEND _missing "gRPC (gRPCConfig.cmake with grpc++ and grpc_cpp_plugin: Debian's "
                       "libgrpc++-dev and protobuf-compiler-grpc)")
endif()
if(NOT Protobuf_FOUND OR NOT Protobuf_PROTOC_EXECUTABLE)
  list(APPEND _missing "Protocol Buffers with protoc (Debian's libprotobuf-dev and "
                       "protobuf-compiler)")
endif()
if(NOT spdlog_FOUND)
  list(APPEND _missing "spdlog (spdlogConfig.cmake: Debian's libspdlog-dev)")
endif()
if(NOT OPENSSL_FOUND OR NOT TARGET OpenSSL::SSL OR NOT TARGET OpenSSL::Crypto)
  list(APPEND _missing "OpenSSL (headers and libssl, libcrypto: Debian's libssl-dev)")
endif()
if(_missing)
  string(JOIN "; " _missing ${_missing})
  if(LOCKSTEP_RUNTIME STREQUAL "AUTO")
    message(WARNING "Worker library not built (InitFromEnv, the gRPC store and progress "
                    "reporting are missing from this build), for want of: ${_missing}. "
                    "-DLOCKSTEP_RUNTIME=OFF silences this.")
    set(LOCKSTEP_RUNTIME_FROM "not built: missing ${_missing}")
    return()
  endif()
  message(FATAL_ERROR "LOCKSTEP_RUNTIME=ON but missing: ${_missing}")
endif()

add_library(lockstep_grpc INTERFACE)
set(_reflection "")
if(TARGET gRPC::grpc++_reflection)
  set(_reflection gRPC::grpc++_reflection)
endif()
target_link_libraries(lockstep_grpc INTERFACE gRPC::grpc++ ${_reflection} protobuf::libprotobuf)
add_library(lockstep_spdlog INTERFACE)
target_link_libraries(lockstep_spdlog INTERFACE spdlog::spdlog)
set(LOCKSTEP_PROTOC "${Protobuf_PROTOC_EXECUTABLE}")
get_target_property(LOCKSTEP_GRPC_CPP_PLUGIN gRPC::grpc_cpp_plugin LOCATION)
set(LOCKSTEP_WITH_RUNTIME TRUE)
set(LOCKSTEP_RUNTIME_FROM
    "gRPC ${gRPC_VERSION} (${gRPC_DIR}), protobuf ${Protobuf_VERSION}, spdlog ${spdlog_VERSION}, OpenSSL ${OPENSSL_VERSION}")

# ---- Gloo ----
if(NOT LOCKSTEP_GLOO STREQUAL "AUTO" AND NOT LOCKSTEP_GLOO)
  message(STATUS "Gloo: off (LOCKSTEP_GLOO=${LOCKSTEP_GLOO})")
else()
  set(_hints "")
  if(GLOO_ROOT)
    set(_hints HINTS "${GLOO_ROOT}" NO_DEFAULT_PATH)
  endif()
  find_path(LOCKSTEP_GLOO_INCLUDE_DIR gloo/rendezvous/context.h ${_hints} PATH_SUFFIXES include)
  find_library(LOCKSTEP_GLOO_LIBRARY gloo ${_hints} PATH_SUFFIXES lib)
  if(LOCKSTEP_GLOO_INCLUDE_DIR AND LOCKSTEP_GLOO_LIBRARY)
    add_library(lockstep_gloo INTERFACE)
    target_include_directories(lockstep_gloo SYSTEM INTERFACE "${LOCKSTEP_GLOO_INCLUDE_DIR}")
    target_link_libraries(lockstep_gloo INTERFACE "${LOCKSTEP_GLOO_LIBRARY}")
    set(LOCKSTEP_WITH_GLOO TRUE)
    message(STATUS "Gloo: ${LOCKSTEP_GLOO_LIBRARY}")
  elseif(LOCKSTEP_GLOO STREQUAL "AUTO")
    message(STATUS "Gloo: not found (GLOO_ROOT='${GLOO_ROOT}', system paths): the gloo and "
                   "shm+gloo backends return Unimplemented in this build")
  else()
    message(FATAL_ERROR "LOCKSTEP_GLOO=ON but gloo/rendezvous/context.h or libgloo was not "
                        "found (GLOO_ROOT='${GLOO_ROOT}', then the system paths)")
  endif()
endif()
