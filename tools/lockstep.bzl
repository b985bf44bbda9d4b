"""Project macros: one place for copts, warnings and the proto rule."""

# Warnings for project code. System headers come in through -isystem (or the
# default search path), so third-party warnings stay quiet.
LOCKSTEP_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
]

def lockstep_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = LOCKSTEP_COPTS + copts, **kwargs)

def lockstep_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = LOCKSTEP_COPTS + copts, **kwargs)

def lockstep_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A GoogleTest test. Links gtest_main unless the test brings its own main."""
    native.cc_test(
        name = name,
        copts = LOCKSTEP_COPTS + copts,
        size = size,
        deps = deps + ["//third_party:gtest_main"],
        **kwargs
    )

def lockstep_proto_library(name, srcs, deps = [], grpc = True, visibility = None):
    """Compiles .proto files with the system protoc (+ grpc_cpp_plugin).

    srcs are paths relative to the package, e.g. "lockstep/v1/store.proto";
    imports are written relative to the package too ("lockstep/v1/x.proto").
    Yields a cc_library `name` whose headers are included the same way:
    #include "lockstep/v1/store.pb.h".

    deps: other lockstep_proto_library targets in the same package whose
    .proto files these import.
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    dep_srcs = [d + "_srcs" for d in deps]
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + dep_srcs,
        visibility = visibility,
    )
    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR)/$$PKG --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) "
    native.genrule(
        name = name + "_gen",
        srcs = srcs + dep_srcs,
        outs = outs,
        cmd = ("PKG=" + native.package_name() + "; " +
               "protoc -I$$PKG --cpp_out=$(GENDIR)/$$PKG " + grpc_flags +
               " ".join(["$$PKG/" + s for s in srcs])),
        message = "protoc " + native.package_name(),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )
