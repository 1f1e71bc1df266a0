"""kernel_op: one op of kernels/, the Tensor-level op with its CPU kernel, as one public target.

The op's files follow the kernel contract (kernels/README.md): <name>.h and <name>.cc hold
the Tensor-level op, cpu/<name>.h the CPU kernel's declarations (private to the target) and
cpu_srcs its definitions (default cpu/<name>.cc). Every op depends on core's tensor, on the
error its device switch raises for a device without a kernel, and on core's trace (the switch
times the kernel as a span).
"""

# For the compute-bound kernels (exp, gelu, softmax): with -march=native GCC's tuning can
# still prefer 256-bit vectors on an AVX-512 CPU; 512-bit ones do twice the lanes per
# instruction (AVX2 builds are unaffected).
WIDE_VECTORS = ["-mprefer-vector-width=512"]

def kernel_op(name, cpu_srcs = None, deps = [], **kwargs):
    native.cc_library(
        name = name,
        srcs = [name + ".cc", "cpu/" + name + ".h"] + (cpu_srcs if cpu_srcs != None else ["cpu/" + name + ".cc"]),
        hdrs = [name + ".h"],
        deps = deps + [":device_not_implemented", "//core:tensor", "//core:trace"],
        visibility = ["//visibility:public"],
        **kwargs
    )
