#!/usr/bin/env python3
"""PyTorch peer of train_bench's tensor-parallel rows: the reference causal LM (vocab 4096,
dim 256, 4 layers, 4 heads, seq 128, learned positions, final LayerNorm, untied output with
bias; ReLU FFN of 4 x dim) written with separate q, k and v projections, as PyTorch users
write it for tensor parallelism, under PyTorch 2.15's parallelize_module with Megatron's plan
(torchtitan's): q, k, v and the FFN's first layer ColwiseParallel, the attention's output and
the FFN's second layer RowwiseParallel, the embedding RowwiseParallel (vocabulary rows), the
output ColwiseParallel. With --sequence-parallel the norms run under SequenceParallel, the
blocks' inputs are prepared from Shard(1) and the row layers reduce-scatter (torchtitan's
plan). With --dp D (FSDP x TP, torchtitan's 2-D) the mesh is (dp D, tp N/D): the plan on
mesh["tp"], then fully_shard on mesh["dp"] for each block and the root. Gloo, one thread per
rank, the ranks of a tensor-parallel group on one batch of 8 sequences per member; started by
torch.distributed.run. Rank 0 prints "torch tp <ms/step> <tokens/s>" (or tp_sp, fsdp_tp;
medians). A non-finite loss fails the run. Without torch it prints "torch missing" and exits 0.

    python3 -m torch.distributed.run --nproc_per_node N tools/bench/peers/tp_peer.py STEPS WARMUP [--sequence-parallel] [--dp D]
"""
import argparse
import sys

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    print("torch missing")
    sys.exit(0)

from fsdp_peer import BATCH_PER_RANK, DIM, HEADS, LAYERS, SEQ, VOCAB, train  # noqa: E402

TP_RANK = 0  # this rank's index in its tensor-parallel group (main sets it)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        # Under tensor parallelism each rank holds heads / tp of the heads: -1 counts them.
        q, k, v = (w(x).view(b, t, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(DIM), Attention(), nn.LayerNorm(DIM)
        self.ffn = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.ReLU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.pos_embed = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        h = self.embed(tokens)
        # Under sequence parallelism h holds this rank's positions only.
        first = TP_RANK * h.shape[1] if h.shape[1] != tokens.shape[1] else 0
        h = h + self.pos_embed(torch.arange(first, first + h.shape[1]))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def plan(sequence_parallel: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    between = Shard(1) if sequence_parallel else Replicate()
    block = {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=between),
        "ffn.0": ColwiseParallel(),
        "ffn.2": RowwiseParallel(output_layouts=between),
    }
    top = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
        "output": ColwiseParallel(input_layouts=between, output_layouts=Replicate()),
    }
    if sequence_parallel:
        block.update(
            {
                "norm1": SequenceParallel(),
                "norm2": SequenceParallel(),
                "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            }
        )
        top["norm"] = SequenceParallel()
    return top, block


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("warmup", type=int)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--dp", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    tp = world // args.dp
    mesh = init_device_mesh("cpu", (args.dp, tp), mesh_dim_names=("dp", "tp"))
    global TP_RANK
    TP_RANK = mesh["tp"].get_local_rank()
    torch.manual_seed(0)
    model = LM()
    top, block = plan(args.sequence_parallel)
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], block)
    parallelize_module(model, mesh["tp"], top)
    if args.dp > 1:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)

    ms = torch.tensor([train(model, args.steps, args.warmup, share=tp)], dtype=torch.float64)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        tokens = BATCH_PER_RANK * world * SEQ
        name = ("fsdp_" if args.dp > 1 else "") + ("tp_sp" if args.sequence_parallel else "tp")
        print(f"torch {name} {ms.item():.1f} {tokens / (ms.item() / 1e3):.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
