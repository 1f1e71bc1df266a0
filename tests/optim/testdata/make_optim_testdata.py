#!/usr/bin/env python3
"""Writes tests/optim/testdata/*.safetensors: PyTorch's values for dtr's optimizers,
learning-rate schedules, clip_grad_norm_ and five training steps of the causal model,
which tests/optim/optim_golden_test.cc checks dtr against.

    ~/torch-venv/bin/python3 tests/optim/testdata/make_optim_testdata.py

Made with torch 2.15.0 and safetensors 0.8.0 on the CPU, torch.manual_seed(0).
- schedules.safetensors: lr at epochs 0..11 (float64) for each schedule, base lr 0.1.
- optimizers.safetensors: a [4, 3] float32 parameter and three gradients; the parameter
  after each of 3 steps for each optimizer configuration ("<config>.step<k>").
- training.safetensors: the causal LM of make_transformer_testdata.py (vocab 32, dim 16,
  2 layers, 2 heads), initial weights ("state.*"), tokens and targets, and after 5 steps
  of AdamW(lr 1e-2, weight_decay 0.1) with warmup (2 steps) then cosine decay (5 steps)
  and clip_grad_norm_(1.0): the losses, the gradient norms clip_grad_norm_ returned and
  the final weights ("final.*").
"""
import math
import pathlib
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "nn/testdata"))
from make_transformer_testdata import Transformer  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[3] / "tests/optim/testdata"
sched = torch.optim.lr_scheduler


def warmup_cosine(warmup, total, min_ratio=0.0):
    def factor(epoch):
        if epoch < warmup:
            return (epoch + 1) / (warmup + 1)
        progress = min(1.0, (epoch - warmup) / (total - warmup))
        return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2
    return factor


def schedules():
    out = {}
    makers = {
        "lambda": lambda o: sched.LambdaLR(o, lambda e: 0.95**e),
        "step": lambda o: sched.StepLR(o, 3, 0.5),
        "linear": lambda o: sched.LinearLR(o, 0.25, 1.0, 4),
        "cosine": lambda o: sched.CosineAnnealingLR(o, 10, 0.001),
        "sequential": lambda o: sched.SequentialLR(
            o, [sched.LinearLR(o, 0.1, 1.0, 3), sched.CosineAnnealingLR(o, 8)], [3]),
        "warmup_cosine": lambda o: sched.LambdaLR(o, warmup_cosine(3, 10, 0.1)),
    }
    for name, make in makers.items():
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        s = make(opt)
        lrs = []
        for _ in range(12):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            s.step()
        out[name] = torch.tensor(lrs, dtype=torch.float64)
    save_file(out, str(OUT / "schedules.safetensors"))


def optimizers():
    p0 = torch.randn(4, 3)
    grads = [torch.randn(4, 3) for _ in range(3)]
    out = {"param": p0, **{f"grad{k}": g for k, g in enumerate(grads)}}
    configs = {
        "sgd": lambda p: torch.optim.SGD([p], lr=0.1),
        "sgd_momentum": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
        "sgd_nesterov": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True),
        "sgd_maximize": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.5, maximize=True),
        "adam": lambda p: torch.optim.Adam([p], lr=0.01, betas=(0.8, 0.99), weight_decay=0.01),
        "adamw": lambda p: torch.optim.AdamW([p], lr=0.01, weight_decay=0.1),
        "adamw_maximize": lambda p: torch.optim.AdamW([p], lr=0.01, weight_decay=0.1, maximize=True),
        "adam_amsgrad": lambda p: torch.optim.Adam([p], lr=0.01, weight_decay=0.01, amsgrad=True),
        "adamw_amsgrad": lambda p: torch.optim.AdamW([p], lr=0.01, weight_decay=0.1, amsgrad=True),
    }
    for name, make in configs.items():
        p = p0.clone().requires_grad_(True)
        opt = make(p)
        for k, g in enumerate(grads):
            p.grad = g.clone()
            opt.step()
            out[f"{name}.step{k}"] = p.detach().clone()
    save_file(out, str(OUT / "optimizers.safetensors"))


def training():
    model = Transformer(32, 16, 2, 2, causal=True, max_seq_len=8, final_norm=True, tie=True)
    out = {f"state.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    tokens = torch.randint(0, 32, (2, 8))
    targets = torch.randint(0, 32, (2, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    s = sched.LambdaLR(opt, warmup_cosine(2, 5))
    losses, norms = [], []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens).reshape(-1, 32), targets.reshape(-1))
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
        opt.step()
        s.step()
        losses.append(loss.item())
    out.update({"tokens": tokens, "targets": targets, "losses": torch.tensor(losses, dtype=torch.float64),
                "grad_norms": torch.tensor(norms, dtype=torch.float64)})
    out.update({f"final.{k}": v.detach().clone() for k, v in model.state_dict().items()})
    save_file({k: v.contiguous() for k, v in out.items()}, str(OUT / "training.safetensors"))
    print("losses", losses, "norms", norms)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    schedules()
    optimizers()
    training()


if __name__ == "__main__":
    main()
