"""lockstep_fuzz_target: one libFuzzer binary (see tests/fuzz/BUILD)."""

load("//tools:lockstep.bzl", "lockstep_cc_binary")

def lockstep_fuzz_target(name, srcs, deps = [], **kwargs):
    """A cc_binary defining LLVMFuzzerTestOneInput in `srcs`.

    Under --config=fuzz it links libFuzzer (-fsanitize=fuzzer: main, the
    mutator); otherwise replay_main.cc. testonly (fakes are fair game) and
    tagged manual.
    """
    lockstep_cc_binary(
        name = name,
        srcs = srcs + select({
            ":fuzz_build": [],
            "//conditions:default": ["replay_main.cc"],
        }),
        linkopts = select({
            ":fuzz_build": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + [":fuzz_check"],
        testonly = True,
        tags = ["manual"],
        **kwargs
    )
