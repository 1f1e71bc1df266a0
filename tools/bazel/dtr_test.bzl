"""dtr_test: a Catch2 test named <name>, built from <name>.cc against Catch2's shared main."""

def dtr_test(name, deps = [], srcs = None, tags = [], args = [], multi_gpu_twin = False, **kwargs):
    """A Catch2 test; with multi_gpu_twin, two from one source.

    multi_gpu_twin = True (a test tagged gpu): <name> runs the cases not tagged [multi_gpu]
    on one CUDA device (tools/test.sh --gpu), and <name without _test>_multi_gpu_test, tagged
    multi_gpu too, runs the [multi_gpu] cases, which fail on fewer than two devices
    (tools/test.sh --multi-gpu).
    """
    srcs = srcs if srcs != None else [name + ".cc"]
    deps = deps + ["//tests:catch_main", "@catch2"]
    if not multi_gpu_twin:
        native.cc_test(name = name, srcs = srcs, deps = deps, tags = tags, args = args, **kwargs)
        return
    if "gpu" not in tags or args or not name.endswith("_test"):
        fail("dtr_test(name = '{}', multi_gpu_twin = True): takes a <name>_test tagged gpu, without args".format(name))
    native.cc_test(name = name, srcs = srcs, deps = deps, tags = tags, args = ["~[multi_gpu]"], **kwargs)
    native.cc_test(
        name = name[:-len("_test")] + "_multi_gpu_test",
        srcs = srcs,
        deps = deps,
        tags = tags + ["multi_gpu"],
        args = ["[multi_gpu]"],
        **kwargs
    )
