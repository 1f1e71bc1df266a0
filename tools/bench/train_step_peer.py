#!/usr/bin/env python3
"""PyTorch peer of train_step_bench: the same causal LM, configuration and data in PyTorch
eager on one thread. Prints one line: "torch tokens/s <value> forward <ms> backward <ms>
optimizer <ms>" (medians per step). Needs `pip install torch==2.15.0`; without torch it
prints "torch missing" and exits 0, so the benchmark runs without it.

    python3 tools/bench/train_step_peer.py VOCAB DIM LAYERS HEADS SEQ BATCH STEPS WARMUP
"""
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch missing")
    sys.exit(0)

sys.path.insert(0, __file__.rsplit("/", 3)[0] + "/tools")
from make_transformer_testdata import Transformer  # noqa: E402


def main() -> None:
    vocab, dim, layers, heads, seq, batch, steps, warmup = map(int, sys.argv[1:9])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(vocab, dim, layers, heads, causal=True, max_seq_len=seq, final_norm=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    tokens = torch.randint(0, vocab, (batch, seq))
    targets = torch.randint(0, vocab, (batch, seq))
    fwd, bwd, upd, total = [], [], [], []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, vocab), targets.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if step >= warmup:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            upd.append(t3 - t2)
            total.append(t3 - t0)
    med = statistics.median
    print(f"torch tokens/s {batch * seq / med(total):.1f} forward {1e3 * med(fwd):.2f} "
          f"backward {1e3 * med(bwd):.2f} optimizer {1e3 * med(upd):.2f}")


if __name__ == "__main__":
    main()
