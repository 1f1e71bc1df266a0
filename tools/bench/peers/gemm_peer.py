#!/usr/bin/env python3
"""PyTorch peer of gemm_bench: torch.mm at the same shapes, layouts, dtypes and thread
count. Each argument is one case, "M,K,N,LA,LB,DTYPE,THREADS" (LA/LB: n = row-major, t = a
transposed view, as gemm_bench builds them; DTYPE float32 or bfloat16). Prints one line per
case, "torch <case> <GFLOP/s>", the median of timed batches after a warm-up. Without torch it
prints "torch missing" and exits 0, so the benchmark runs without it.

    python3 tools/bench/peers/gemm_peer.py 1024,256,768,n,t,float32,1 ...
"""
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch missing")
    sys.exit(0)


def operand(rows: int, cols: int, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """A rows x cols matrix, row-major or the transpose of a row-major cols x rows one."""
    if layout == "t":
        return torch.randn(cols, rows).to(dtype).t()
    return torch.randn(rows, cols).to(dtype)


def gflops(m: int, k: int, n: int, la: str, lb: str, dtype: torch.dtype) -> float:
    a, b = operand(m, k, la, dtype), operand(k, n, lb, dtype)
    out = torch.empty(m, n, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    samples = []
    deadline = time.perf_counter() + 0.6
    while len(samples) < 7 or time.perf_counter() < deadline:
        reps, start = 0, time.perf_counter()
        while reps == 0 or time.perf_counter() - start < 0.02:
            torch.mm(a, b, out=out)
            reps += 1
        samples.append((time.perf_counter() - start) / reps)
    return 2.0 * m * k * n / statistics.median(samples) / 1e9


def main() -> None:
    for case in sys.argv[1:]:
        m, k, n, la, lb, dtype, threads = case.split(",")
        torch.set_num_threads(int(threads))
        value = gflops(int(m), int(k), int(n), la, lb, getattr(torch, dtype))
        print(f"torch {case} {value:.1f}", flush=True)


if __name__ == "__main__":
    main()
