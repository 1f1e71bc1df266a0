#!/usr/bin/env python3
"""PyTorch peer of fsdp_bench: the same causal LM and configuration under PyTorch 2.15's
fully_shard (FSDP2: each block, then the root) and DistributedDataParallel, on gloo, one
thread per rank, started by torch.distributed.run. Rank 0 prints one line:
"torch fsdp <ms/step> <tokens/s> ddp <ms/step> <tokens/s>" (medians). With
--mixed-precision it trains only fully_shard under MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=float32; the root's outputs float32, as dtr's train does) and prints
"torch fsdp_mp <ms/step> <tokens/s>". A non-finite loss fails the run. Needs
`pip install torch==2.15.0`; without torch it prints "torch missing" and exits 0.

    python3 -m torch.distributed.run --nproc_per_node N tools/bench/peers/fsdp_peer.py STEPS WARMUP [--mixed-precision]
"""
import argparse
import math
import pathlib
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("torch missing")
    sys.exit(0)

# The model class the golden tests check against dtr's, beside its test data.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests" / "nn" / "testdata"))
from make_transformer_testdata import Transformer  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, SEQ, BATCH_PER_RANK = 4096, 256, 4, 4, 128, 8


def train(model, steps: int, warmup: int, seq: int = SEQ, probe=None, share: int = 1,
          batch: int = BATCH_PER_RANK) -> float:
    """Median ms per step over `steps` steps after `warmup`, on sequences of `seq` tokens:
    `batch` of this rank's own, or, for groups of `share` consecutive ranks (a
    tensor-parallel group, tp_peer.py), one batch of `batch` per member that every member
    holds. A `probe` (ac_peer.py's memory probe) is told when each step starts and when its
    backward has ended."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    rows = batch * share
    g = torch.Generator().manual_seed(1 + dist.get_rank() // share)
    ids = torch.randint(0, VOCAB, (rows, seq + 1), generator=g)
    x, y = ids[:, :-1], ids[:, 1:].reshape(-1)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        if probe:
            probe.start()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y)
        loss.backward()
        if probe:
            probe.after_backward()
        opt.step()
        value = loss.item()
        if not math.isfinite(value):
            raise RuntimeError(f"step {step}: loss {value} is not finite")
        if step >= warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("warmup", type=int)
    parser.add_argument("--mixed-precision", action="store_true")
    args = parser.parse_args()
    steps, warmup = args.steps, args.warmup
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    tokens = BATCH_PER_RANK * SEQ * world

    torch.manual_seed(0)
    model = Transformer(VOCAB, DIM, LAYERS, HEADS, causal=True, max_seq_len=SEQ, final_norm=True)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if args.mixed_precision:
        block_mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        root_mp = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32
        )
        for layer in model.layers:
            fully_shard(layer, mp_policy=block_mp)
        fully_shard(model, mp_policy=root_mp)
        times = torch.tensor([train(model, steps, warmup)], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        if dist.get_rank() == 0:
            f = times.item()
            print(f"torch fsdp_mp {f:.1f} {tokens / (f / 1e3):.1f}")
        dist.destroy_process_group()
        return

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    fsdp_ms = train(model, steps, warmup)

    torch.manual_seed(0)
    model = Transformer(VOCAB, DIM, LAYERS, HEADS, causal=True, max_seq_len=SEQ, final_norm=True)
    ddp_ms = train(torch.nn.parallel.DistributedDataParallel(model), steps, warmup)

    times = torch.tensor([fsdp_ms, ddp_ms], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        f, d = times.tolist()
        print(f"torch fsdp {f:.1f} {tokens / (f / 1e3):.1f} ddp {d:.1f} {tokens / (d / 1e3):.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
