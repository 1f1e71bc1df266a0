"""cuda_configure: the CUDA toolkit as a local repository.

The toolkit's location comes from $CUDA_HOME (default /usr/local/cuda), so a
user's own install works. The repository exposes the headers, the runtime,
cuBLAS(Lt) and NCCL as cc_library targets, and NVCC (its absolute path) in
defs.bzl for the cuda_library macro.
"""

def _cuda_configure_impl(rctx):
    cuda_home = rctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = rctx.path(cuda_home + "/bin/nvcc")
    if not nvcc.exists:
        fail("dtr: no nvcc at %s; set CUDA_HOME to the CUDA toolkit" % nvcc)
    rctx.symlink(cuda_home + "/include", "include")
    libdirs = [d for d in [cuda_home + "/lib64", cuda_home + "/lib"] if rctx.path(d).exists]
    linkdirs = " ".join(['"-L%s", "-Wl,-rpath,%s",' % (d, d) for d in libdirs])
    rctx.file("defs.bzl", 'NVCC = "%s"\nCUDA_HOME = "%s"\n' % (nvcc, cuda_home))
    rctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

[cc_library(
    name = lib,
    linkopts = [{linkdirs} "-l" + lib],
    deps = [":headers"],
) for lib in ["cudart", "cublas", "cublasLt", "nccl"]]
""".format(linkdirs = linkdirs))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
