#!/usr/bin/env python3
"""PyTorch peer of train_step_bench: the same causal LM, configuration and data in PyTorch
eager on one thread. Prints two lines: "torch tokens/s <value> forward <ms> backward <ms>
optimizer <ms>" (medians per step), then "torch split" and the ms per step of each op family
in train_step_bench's order (tools/bench/op_family.h), means over as many steps again run
under torch.profiler: each aten op's self time counts for its family, the optimizer step
whole, and the rest of the step is autograd and dispatch. Needs `pip install torch==2.15.0`; without torch it
prints "torch missing" and exits 0, so the benchmark runs without it.

    python3 tools/bench/peers/train_step_peer.py VOCAB DIM LAYERS HEADS SEQ BATCH STEPS WARMUP
"""
import pathlib
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch missing")
    sys.exit(0)

# The model class the golden tests check against dtr's, beside its test data.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests" / "nn" / "testdata"))
from make_transformer_testdata import Transformer  # noqa: E402


FAMILIES = ["matmul", "attention", "norms", "elementwise", "embedding and loss", "optimizer", "overhead"]


def family_of(name: str) -> str | None:
    """The family of a profiler event by its name (None: not an aten op, so overhead)."""
    if not name.startswith("aten::"):
        return None
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if "layer_norm" in name:
        return "norms"
    if name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "matmul"
    if any(k in name for k in ("embedding", "nll_loss", "log_softmax", "cross_entropy")):
        return "embedding and loss"
    return "elementwise"


def in_optimizer(event) -> bool:
    while event is not None:
        if event.name.startswith("Optimizer.step"):
            return True
        event = event.cpu_parent
    return False


def profiled_split(step, steps: int) -> list[float]:
    """ms per step of each family over `steps` calls of step() (which returns its optimizer ms)."""
    from torch.profiler import ProfilerActivity, profile

    total_ms = optimizer_ms = 0.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t0 = time.perf_counter()
            optimizer_ms += step()
            total_ms += 1e3 * (time.perf_counter() - t0)
    split = dict.fromkeys(FAMILIES, 0.0)
    for event in prof.events():
        family = family_of(event.name)
        if family is not None and not in_optimizer(event):
            split[family] += event.self_cpu_time_total / 1e3
    split["optimizer"] = optimizer_ms
    split["overhead"] = total_ms - sum(split.values())
    return [split[f] / steps for f in FAMILIES]


def main() -> None:
    vocab, dim, layers, heads, seq, batch, steps, warmup = map(int, sys.argv[1:9])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(vocab, dim, layers, heads, causal=True, max_seq_len=seq, final_norm=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    tokens = torch.randint(0, vocab, (batch, seq))
    targets = torch.randint(0, vocab, (batch, seq))
    fwd, bwd, upd, total = [], [], [], []

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        upd.append(t3 - t2)
        total.append(t3 - t0)
        return 1e3 * (t3 - t2)

    for _ in range(warmup + steps):
        step()
    med = statistics.median
    timed = slice(warmup, warmup + steps)
    print(f"torch tokens/s {batch * seq / med(total[timed]):.1f} forward {1e3 * med(fwd[timed]):.2f} "
          f"backward {1e3 * med(bwd[timed]):.2f} optimizer {1e3 * med(upd[timed]):.2f}")
    print("torch split " + " ".join(f"{v:.3f}" for v in profiled_split(step, steps)))


if __name__ == "__main__":
    main()
