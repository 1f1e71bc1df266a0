"""dtr_test: a Catch2 test named <name>, built from <name>.cc against Catch2's shared main."""

def dtr_test(name, deps = [], srcs = None, tags = [], **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs if srcs != None else [name + ".cc"],
        deps = deps + ["//tests:catch_main", "@catch2"],
        tags = tags,
        **kwargs
    )
