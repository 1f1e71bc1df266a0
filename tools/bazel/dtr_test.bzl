"""dtr_test: a Catch2 test named <name>, built from <name>.cc against Catch2's shared main."""

def dtr_test(name, deps = [], srcs = None, tags = [], args = [], twin = None, **kwargs):
    """A Catch2 test; with `twin`, two targets from one source.

    twin = "gpu" or "multi_gpu": the source's cases tagged [<twin>] run from their own target,
    <name without _test>_<twin>_test, tagged <twin> as well (tools/test.sh runs gpu targets
    with --gpu and multi_gpu ones with --multi-gpu; a multi_gpu case fails on fewer than two
    devices); <name> runs the other cases.
    """
    srcs = srcs if srcs != None else [name + ".cc"]
    deps = deps + ["//tests:catch_main", "@catch2"]
    if twin == None:
        native.cc_test(name = name, srcs = srcs, deps = deps, tags = tags, args = args, **kwargs)
        return
    if twin not in ["gpu", "multi_gpu"] or args or not name.endswith("_test"):
        fail("dtr_test(name = '{}', twin = {}): takes twin 'gpu' or 'multi_gpu', a <name>_test and no args".format(
            name,
            repr(twin),
        ))
    native.cc_test(name = name, srcs = srcs, deps = deps, tags = tags, args = ["~[{}]".format(twin)], **kwargs)
    native.cc_test(
        name = "{}_{}_test".format(name[:-len("_test")], twin),
        srcs = srcs,
        deps = deps,
        tags = tags + [twin],
        args = ["[{}]".format(twin)],
        **kwargs
    )
