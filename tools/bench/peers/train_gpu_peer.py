#!/usr/bin/env python3
"""PyTorch peer of the GPU check's training row: the model `train --arch gpt` builds (causal
attention, learned positions, a final LayerNorm, the output tied to the embedding; blocks of
LayerNorm, multi-head attention and a ReLU MLP of width 4 dim) under PyTorch 2.15's
fully_shard (FSDP2: each block, then the root) on one GPU (NCCL, a world of one), bf16
parameters with float32 reduction and float32 logits, AdamW, random tokens. Prints one line:
"torch fsdp_gpu <ms/step> <tokens/s> <mfu>" (medians after the warm-up), with MFU as
dtr's train computes it (6N + 12 L d T FLOPs per token over --peak TFLOP/s). Without torch or
a GPU it prints "torch missing" or "torch: no GPU" and exits 0.

    python3 -m torch.distributed.run --standalone --nproc_per_node 1 tools/bench/peers/train_gpu_peer.py \\
        --dim 2048 --layers 16 --heads 16 --seq-len 2048 --batch-size 8 --vocab 256 --steps 10 --warmup 2 --peak 989
"""
import argparse
import math
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    print("torch missing")
    sys.exit(0)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.in_proj = nn.Linear(dim, 3 * dim)
        self.out_proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.in_proj(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out_proj(a)
        return x + self.ffn(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos_embed = nn.Embedding(seq, dim)
        self.layers = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.output.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos_embed(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def main() -> None:
    p = argparse.ArgumentParser()
    # The train program's flag names, so that gpu_run.sh passes both the same model flags.
    for name, default in [("dim", 2048), ("layers", 16), ("heads", 16), ("seq-len", 2048), ("batch-size", 8),
                          ("vocab", 256), ("steps", 10), ("warmup", 2)]:
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--peak", type=float, default=989.0, help="dense bf16 TFLOP/s of the GPU")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("torch: no GPU")
        return
    dist.init_process_group("nccl")
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = GPT(a.vocab, a.dim, a.layers, a.heads, a.seq_len).cuda()
    n_params = sum(t.numel() for t in model.parameters())
    block_mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=block_mp)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                      output_dtype=torch.float32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ids = torch.randint(0, a.vocab, (a.batch_size, a.seq_len + 1), device="cuda")
    x, y = ids[:, :-1], ids[:, 1:].reshape(-1)
    times = []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x).reshape(-1, a.vocab), y)
        loss.backward()
        opt.step()
        value = loss.item()
        if not math.isfinite(value):
            raise RuntimeError(f"train_gpu_peer: step {step}: loss {value} is not finite")
        if step >= a.warmup:
            times.append(1e3 * (time.perf_counter() - t0))
    ms = statistics.median(times)
    tokens_per_s = a.batch_size * a.seq_len / (ms / 1e3)
    flops_per_token = 6 * n_params + 12 * a.layers * a.dim * a.seq_len
    print(f"torch fsdp_gpu {ms:.1f} {tokens_per_s:.0f} {tokens_per_s * flops_per_token / (a.peak * 1e12):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
