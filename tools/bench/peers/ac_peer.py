#!/usr/bin/env python3
"""PyTorch peer of ac_bench: fsdp_peer.py's causal LM at one sequence length with activation
checkpointing, on gloo, one thread per rank, started by torch.distributed.run. Each policy
wraps blocks in checkpoint_wrapper (non-reentrant torch.utils.checkpoint; none: no block,
every2: blocks 0, 2, ..., full: every block; selective: every block, torchtitan's per-op
policy through create_selective_checkpoint_contexts: attention's results saved, and of the
matrix products the first, third, ... of each block, the others recomputed), then, on more than one rank, fully_shard on each block
and the root, as torchtitan orders them; fsdp_peer.train times it. Rank 0 prints one
line: "torch ac <policy> <ms/step> <tokens/s> <peak MiB> <peak MiB at FEW sequences>" per
policy (ms/step: the median, the largest of any rank; the second peak from as many steps
with FEW sequences per rank, whence ac_bench computes the memory that grows with the batch).

torch's CPU allocator keeps no peak, so memory is the process's resident set over forward
and backward (the optimizer step left out: AdamW's foreach temporaries would be the peak of
every policy alike): at each step's start its high-water mark (VmHWM) is reset through
/proc/self/clear_refs, and read when backward ends; the peak is the largest such mark less
the resident set after the model was built (freed memory handed back by malloc_trim first),
plus the rank's parameter bytes. glibc maps every allocation of 128 KiB or more apart and
unmaps it when freed (mallopt), so the resident set follows the live tensors. One untimed
step before the first policy takes what the process allocates once. Without torch it
prints "torch missing" and exits 0.

    python3 -m torch.distributed.run --nproc_per_node N tools/bench/peers/ac_peer.py STEPS WARMUP SEQ FEW
"""
import argparse
import ctypes
import functools
import gc
import sys

try:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
except ImportError:
    print("torch missing")
    sys.exit(0)

from fsdp_peer import BATCH_PER_RANK, DIM, HEADS, LAYERS, VOCAB, Transformer, train  # noqa: E402

# Which blocks each policy checkpoints.
POLICIES = {
    "none": lambda i: False,
    "every2": lambda i: i % 2 == 0,
    "full": lambda i: True,
    "selective": lambda i: True,
}
# What selective saves (torchtitan's _save_list for this model: its linears carry biases).
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


def save_products(counts, ctx, op, *args, **kwargs):
    """torchtitan's _get_custom_policy: every second mm of a block (counted apart in its forward
    and its recompute) recomputed, the rest of SAVED_OPS saved."""
    from torch.utils.checkpoint import CheckpointPolicy

    mode = "recompute" if ctx.is_recompute else "forward"
    if op in PRODUCTS:
        counts[mode] += 1
    keep = op in SAVED_OPS and not (op in PRODUCTS and counts[mode] % 2 == 0)
    return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts():
    """One block's contexts, with its own product counts (torchtitan's context_fn)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(functools.partial(save_products, {"forward": 0, "recompute": 0}))
MIB = 1024.0 * 1024.0
M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def resident_kib(field: str) -> int:
    """VmRSS or VmHWM of this process, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"ac_peer: no {field} in /proc/self/status")


class ResidentPeak:
    """The largest resident set of the steps' forward and backward, in KiB."""

    def __init__(self):
        self.peak_kib = 0

    def start(self):
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # VmHWM := VmRSS

    def after_backward(self):
        self.peak_kib = max(self.peak_kib, resident_kib("VmHWM"))


def local_parameter_bytes(model) -> int:
    """This rank's bytes of the parameters (a DTensor's local shard under fully_shard)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).nbytes for p in model.parameters())


def build(policy: str, seq: int, world: int):
    torch.manual_seed(0)
    model = Transformer(VOCAB, DIM, LAYERS, HEADS, causal=True, max_seq_len=seq, final_norm=True)
    selective = {}
    if policy == "selective":
        selective = {"context_fn": selective_contexts}
    for i, layer in enumerate(model.layers):
        if POLICIES[policy](i):
            model.layers[i] = checkpoint_wrapper(layer, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **selective)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("warmup", type=int)
    parser.add_argument("seq", type=int)
    parser.add_argument("few", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    tokens = BATCH_PER_RANK * args.seq * world
    libc = ctypes.CDLL("libc.so.6")
    # Every allocation of 128 KiB or more its own mapping, returned when freed: glibc would
    # otherwise raise this threshold as tensors are freed and keep them in its heap, and
    # the resident set would stay at the first step's peak whatever the policy.
    libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024)
    # One untimed step first, so that what the process allocates once (the autograd engine,
    # gloo's and the kernels' first-use state) counts in no policy's resident set.
    train(build("none", args.seq, world), 1, 0, args.seq)
    lines = []
    for policy in POLICIES:
        figures = []
        for batch in (BATCH_PER_RANK, args.few):
            model = build(policy, args.seq, world)
            param_bytes = local_parameter_bytes(model)
            gc.collect()
            libc.malloc_trim(0)
            base_kib = resident_kib("VmRSS")
            probe = ResidentPeak()
            ms = train(model, args.steps, args.warmup, args.seq, probe, batch=batch)
            figures += [ms, param_bytes + (probe.peak_kib - base_kib) * 1024.0]
            del model
        figures = torch.tensor(figures, dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        ms, peak, _, peak_few = figures.tolist()
        lines.append(f"torch ac {policy} {ms:.1f} {tokens / (ms / 1e3):.1f} {peak / MIB:.1f} {peak_few / MIB:.1f}")
    if dist.get_rank() == 0:
        print("\n".join(lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
