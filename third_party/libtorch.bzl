"""LibTorch for Bazel: Debian's (CPU) by default, or any LibTorch 2.x.

The repository rule `lockstep_libtorch` defines @libtorch//:torch. Which
LibTorch it wraps comes from the environment variable LOCKSTEP_LIBTORCH,
passed with --repo_env:

  unset     Debian's libtorch-dev: headers in /usr/include (the C++ frontend
            in /usr/include/torch/csrc/api/include), libraries on the
            linker's default path.
  a prefix  a LibTorch with include/ and lib/: the unzipped download
            (libtorch/) or pip's torch package (site-packages/torch), CPU
            or CUDA. Its libraries are linked by path with an rpath, and
            libtorch_cuda/libc10_cuda with --no-as-needed when present (the
            CUDA backend registers itself from static initialisers only).

  bazel build --repo_env=LOCKSTEP_LIBTORCH=/opt/libtorch --config=cuda //examples:train

The C++ ABI (_GLIBCXX_USE_CXX11_ABI) is read from the prefix's
TorchConfig.cmake (share/cmake/Torch/); 1 when it does not say. Changing the
variable re-runs the rule (environ below).
"""

def _fail(msg):
    fail("LOCKSTEP_LIBTORCH: " + msg)

def _abi(ctx, root):
    for rel in ["share/cmake/Torch/TorchConfig.cmake", "lib/cmake/Torch/TorchConfig.cmake"]:
        path = ctx.path(root + "/" + rel)
        if path.exists:
            text = ctx.read(path)
            for abi in ["0", "1"]:
                if "_GLIBCXX_USE_CXX11_ABI=" + abi in text:
                    return abi
    return "1"

def _impl(ctx):
    root = ctx.os.environ.get("LOCKSTEP_LIBTORCH", "").rstrip("/")
    if not root:
        ctx.symlink("/usr/include/torch/csrc/api/include", "api")
        ctx.file("BUILD", """# Debian's libtorch-dev (CPU); see third_party/libtorch.bzl.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = glob(["api/torch/**/*.h"]),
    includes = ["api"],
    defines = ["_GLIBCXX_USE_CXX11_ABI=1"],
    linkopts = [
        "-Wl,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-Wl,--as-needed",
        "-lpthread",
    ],
)
""")
        return

    if not root.startswith("/"):
        _fail("must be an absolute path, not '%s'" % root)
    for rel in ["include/ATen/ATen.h", "include/torch/csrc/api/include/torch/torch.h", "lib/libtorch.so", "lib/libtorch_cpu.so", "lib/libc10.so"]:
        if not ctx.path(root + "/" + rel).exists:
            _fail("'%s' is not a LibTorch prefix: %s/%s is missing (want the unzipped libtorch/ or pip's site-packages/torch)" % (root, root, rel))
    ctx.symlink(root + "/include", "include")
    libs = ["torch", "torch_cpu", "c10"]
    cuda = ctx.path(root + "/lib/libtorch_cuda.so").exists and ctx.path(root + "/lib/libc10_cuda.so").exists
    if cuda:
        libs += ["torch_cuda", "c10_cuda"]
    linkopts = ["-Wl,-rpath,%s/lib" % root, "-Wl,--no-as-needed"]
    linkopts += ["%s/lib/lib%s.so" % (root, lib) for lib in libs]
    linkopts += ["-Wl,--as-needed", "-lpthread"]
    ctx.file("BUILD", """# LibTorch at {root} (LOCKSTEP_LIBTORCH; CUDA libraries: {cuda}); see
# third_party/libtorch.bzl.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"], allow_empty = True),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI={abi}"] + {cuda_defines},
    linkopts = {linkopts},
)
""".format(
        root = root,
        cuda = cuda,
        abi = _abi(ctx, root),
        cuda_defines = repr(["LOCKSTEP_TORCH_CUDA=1"] if cuda else []),
        linkopts = repr(linkopts),
    ))

lockstep_libtorch = repository_rule(
    implementation = _impl,
    environ = ["LOCKSTEP_LIBTORCH"],
    local = True,
)
