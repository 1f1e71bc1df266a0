#!/usr/bin/env python3
"""Writes tests/nn/testdata/transformer/<case>.safetensors: PyTorch's values for
MultiheadAttention (with each kind of mask) and for the seed's Transformer and its causal
variant, which tests/nn/transformer_golden_test.cc checks dtr against; and
tests/train/testdata/init_from/: a GPT-style model's state dict as PyTorch saves it, a
nanoGPT token file and the loss of the train program's first batch of it, which
tests/train/train_test.cc reproduces with --init-from.

    ~/torch-venv/bin/python3 tests/nn/testdata/make_transformer_testdata.py

Made with torch 2.15.0 and safetensors 0.8.0 on the CPU, torch.manual_seed(0), float32.
Files hold the module's state dict under "state.<name>", the inputs, the output (and for
the models the cross-entropy loss of random targets), the upstream gradient, and every
parameter's gradient ("grad.<name>"). The model classes below are the seed's model written
in PyTorch: the names of their parameters are the ones dtr's nn::Transformer must give.
"""
import pathlib

import torch
from safetensors.torch import save_file

nn = torch.nn
OUT = pathlib.Path(__file__).resolve().parents[3] / "tests/nn/testdata/transformer"


class TransformerBlock(nn.Module):
    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.causal = causal
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        t = x.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1) if self.causal else None
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.ffn(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab, dim, layers, heads, causal=False, max_seq_len=0, final_norm=False, tie=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        if max_seq_len:
            self.pos_embed = nn.Embedding(max_seq_len, dim)
        self.layers = nn.ModuleList([TransformerBlock(dim, heads, causal) for _ in range(layers)])
        if final_norm:
            self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=not tie)
        if tie:
            self.output.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        if hasattr(self, "pos_embed"):
            x = x + self.pos_embed(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x)
        if hasattr(self, "norm"):
            x = self.norm(x)
        return self.output(x)


def save(name, module, tensors):
    for k, p in module.named_parameters():
        tensors[f"grad.{k}"] = p.grad.clone()
    tensors.update({f"state.{k}": v.detach().clone() for k, v in module.state_dict().items()})
    tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
    save_file(tensors, str(OUT / f"{name}.safetensors"))
    print(name, len(tensors), "tensors")


def attention_case(name, batch_first, **masks):
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    shape = (2, 5, 8) if batch_first else (5, 2, 8)
    q, k, v = (torch.randn(shape) for _ in range(3))
    out, weights = mha(q, k, v, need_weights=True, **masks)
    g = torch.randn_like(out)
    out.backward(g)
    tensors = {"query": q, "key": k, "value": v, "output": out.detach(), "weights": weights.detach(), "grad_output": g}
    for key, m in masks.items():
        if isinstance(m, torch.Tensor):
            tensors[key] = m
    save(name, mha, tensors)


def model_case(name, **config):
    model = Transformer(32, 16, 2, 2, **config)
    tokens = torch.randint(0, 32, (2, 8))
    targets = torch.randint(0, 32, (2, 8))
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))
    loss.backward()
    save(name, model, {"tokens": tokens, "targets": targets, "logits": logits.detach(), "loss": loss.detach()})


def train_init_case():
    """The train program's first step: global batch 2 of windows 0 and 1 (sequential order)."""
    out = OUT.parent.parent.parent / "train/testdata/init_from"
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    model = Transformer(32, 16, 2, 2, causal=True, max_seq_len=8, final_norm=True, tie=True)
    stream = torch.randint(0, 32, (400,))
    stream.to(torch.int32).numpy().astype("<u2").tofile(str(out / "tokens.bin"))
    seq = 8
    x = torch.stack([stream[w * seq : w * seq + seq] for w in range(2)])
    y = torch.stack([stream[w * seq + 1 : w * seq + seq + 1] for w in range(2)])
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 32), y.reshape(-1))
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    (out / "first_loss.txt").write_text(f"{loss.item():.9g}\n")
    print("train init_from: first loss", loss.item())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    attention_case("mha", True)
    attention_case("mha_seq_first", False)
    attention_case("mha_bool_mask", True, attn_mask=torch.rand(5, 5) > 0.7)
    attention_case("mha_additive_mask", True, attn_mask=torch.randn(5, 5))
    attention_case("mha_key_padding", True, key_padding_mask=torch.tensor([[False] * 5, [False] * 3 + [True] * 2]))
    attention_case("mha_causal", True, attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1), is_causal=True)
    model_case("seed")
    model_case("causal_lm", causal=True, max_seq_len=8, final_norm=True, tie=True)
    train_init_case()


if __name__ == "__main__":
    main()
