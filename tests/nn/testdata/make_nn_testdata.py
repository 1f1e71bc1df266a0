#!/usr/bin/env python3
"""Writes tests/nn/testdata/layers/<case>.safetensors: PyTorch's values for each nn layer
that tests/nn/layers_golden_test.cc checks dtr against.

    ~/torch-venv/bin/python3 tests/nn/testdata/make_nn_testdata.py

Made with torch 2.15.0 and safetensors 0.8.0 on the CPU, torch.manual_seed(0), float32.
Each layer's file holds its state dict under "state.<name>", the input "input", the output
"output", an upstream gradient "grad_output", and the gradients of the input
("grad.input", floating inputs only) and of every parameter ("grad.<name>") after
output.backward(grad_output); metadata "layer" and "options" say what was built. The loss files
(cross_entropy_*, mse_*) hold "input", "target", "output", "grad_output" and "grad.input".
"""
import json
import pathlib

import torch
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parents[3] / "tests/nn/testdata/layers"


def case(name, module, x, options):
    x = x.clone()
    if x.is_floating_point():
        x.requires_grad_(True)
    y = module(x)
    g = torch.randn_like(y)
    y.backward(g)
    tensors = {f"state.{k}": v.detach().clone().contiguous() for k, v in module.state_dict().items()}
    tensors.update({"input": x.detach().clone(), "output": y.detach().clone(), "grad_output": g})
    if x.is_floating_point():
        tensors["grad.input"] = x.grad.clone()
    for k, p in module.named_parameters():
        tensors[f"grad.{k}"] = p.grad.clone()
    save_file(tensors, str(OUT / f"{name}.safetensors"),
              metadata={"layer": type(module).__name__, "options": json.dumps(options)})
    print(f"{name}: {sorted(tensors)}")


def loss_case(name, loss_fn, x, target, options):
    x = x.clone().requires_grad_(True)
    y = loss_fn(x, target)
    g = torch.randn_like(y)
    y.backward(g)
    tensors = {"input": x.detach().clone(), "target": target, "output": y.detach().clone(), "grad_output": g,
               "grad.input": x.grad.clone()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(OUT / f"{name}.safetensors"),
              metadata={"layer": "loss", "options": json.dumps(options)})
    print(f"{name}: {sorted(tensors)}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    nn = torch.nn
    case("linear", nn.Linear(5, 3), torch.randn(2, 4, 5), {"in": 5, "out": 3, "bias": True})
    case("linear_nobias", nn.Linear(5, 3, bias=False), torch.randn(4, 5), {"in": 5, "out": 3, "bias": False})
    idx = torch.tensor([[1, 2, 3], [2, 9, 0]])
    case("embedding", nn.Embedding(10, 4, padding_idx=2), idx, {"num": 10, "dim": 4, "padding_idx": 2})
    case("layer_norm", nn.LayerNorm(6), torch.randn(3, 6), {"shape": [6], "eps": 1e-5, "bias": True})
    case("layer_norm_nobias", nn.LayerNorm(6, bias=False), torch.randn(3, 6), {"shape": [6], "eps": 1e-5, "bias": False})
    case("rms_norm", nn.RMSNorm(6), torch.randn(3, 6), {"shape": [6]})
    case("gelu", nn.GELU(), torch.randn(4, 5), {"approximate": "none"})
    case("gelu_tanh", nn.GELU(approximate="tanh"), torch.randn(4, 5), {"approximate": "tanh"})
    case("relu", nn.ReLU(), torch.randn(4, 5), {})
    case("silu", nn.SiLU(), torch.randn(4, 5), {})
    ffn = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4))
    case("ffn", ffn, torch.randn(3, 4), {"dim": 4})
    f = torch.nn.functional
    logits, target = torch.randn(6, 5), torch.tensor([0, 4, -100, 2, 2, 1])
    for reduction in ("mean", "sum", "none"):
        loss_case(f"cross_entropy_{reduction}", lambda a, b, r=reduction: f.cross_entropy(a, b, reduction=r),
                  logits, target, {"reduction": reduction, "ignore_index": -100, "label_smoothing": 0.0})
        loss_case(f"cross_entropy_smooth_{reduction}",
                  lambda a, b, r=reduction: f.cross_entropy(a, b, reduction=r, label_smoothing=0.1),
                  logits, target, {"reduction": reduction, "ignore_index": -100, "label_smoothing": 0.1})
        loss_case(f"mse_{reduction}", lambda a, b, r=reduction: f.mse_loss(a, b, reduction=r),
                  torch.randn(3, 4), torch.randn(3, 4), {"reduction": reduction})


if __name__ == "__main__":
    main()
