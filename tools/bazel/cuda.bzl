"""cuda_library: .cu files compiled by nvcc, linked like any cc_library.

Device code never includes fmt (nvcc 13 cannot evaluate fmt 9's consteval format
checks): errors are raised through functions defined in .cc files.
Each .cu becomes one object (a genrule running nvcc for sm_80 and sm_90, with
PTX for newer cards; `--define cuda_archs=sm_90` builds sm_90 code alone, as the
GPU bundle does); the objects and hdrs form a cc_library that links the CUDA
runtime. Every build compiles them, whether or not a GPU is present.
"""

load("@local_cuda//:defs.bzl", "NVCC")

CUDA_ARCHS = ["80", "90"]

def _gencode(archs, ptx):
    flags = ["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in archs]
    if ptx:
        flags.append("-gencode arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1]))
    return " ".join(flags)

# The headers every .cu may include: core's and core/cuda's, and its own package's (each
# package with a cuda_library defines a filegroup `headers` of its .h and .cuh files).
_COMMON_HEADERS = ["//core:headers", "//core/cuda:headers"]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """srcs: .cu files; they may include the headers of core, core/cuda and their package."""
    own = "//%s:headers" % native.package_name()
    cuda_hdrs = _COMMON_HEADERS + ([] if own in _COMMON_HEADERS else [":headers"])
    gencode = select({
        "//tools/bazel:cuda_archs_sm_90": _gencode(["90"], ptx = False),
        "//conditions:default": _gencode(CUDA_ARCHS, ptx = True),
    })
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + cuda_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-std=c++20 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC",
            ]) + " " + gencode + " " + " ".join([
                "-I. -I$(GENDIR)",
                " ".join(copts),
                "-c $(location %s) -o $@" % src,
            ]),
            message = "nvcc " + src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        **kwargs
    )
