#!/usr/bin/env python3
"""Writes tests/checkpoint/testdata/torch_written.safetensors with PyTorch's safetensors, for the
test that dtr loads a file PyTorch wrote (tests/checkpoint/safetensors_test.cc checks the values).

    python3 -m venv ~/torch-venv && ~/torch-venv/bin/pip install torch==2.15.0 safetensors
    ~/torch-venv/bin/python3 tests/checkpoint/testdata/make_safetensors_testdata.py

Made with torch 2.15.0 and safetensors 0.8.0. It also checks the other direction: it reads
a file dtr wrote, given as the first argument (tests/nn:safetensors_test writes
$TEST_TMPDIR/.../model.safetensors), and prints every tensor's name, dtype and shape.
"""
import pathlib
import sys

import torch
from safetensors.torch import load_file, save_file

OUT = pathlib.Path(__file__).resolve().parents[3] / "tests/checkpoint/testdata/torch_written.safetensors"


def main() -> None:
    tensors = {
        "f32": torch.tensor([[0, 1.5, -2], [3.25, 4, -5.5]], dtype=torch.float32),
        "f64": torch.tensor([0.1, -0.2], dtype=torch.float64),
        "bf16": torch.tensor([1, -2, 0.5], dtype=torch.bfloat16),
        "f16": torch.tensor([0.25, 65504], dtype=torch.float16),
        "i32": torch.tensor([-7, 8, 2**31 - 1], dtype=torch.int32),
        "i64": torch.tensor([-(2**63), 2**63 - 1], dtype=torch.int64),
        "mask": torch.tensor([True, False, True, True]),
    }
    save_file(tensors, str(OUT), metadata={"written_by": "safetensors.torch.save_file"})
    print(f"wrote {OUT}")
    if len(sys.argv) > 1:
        for name, t in load_file(sys.argv[1]).items():
            print(f"read from dtr's file: {name} {t.dtype} {tuple(t.shape)}")


if __name__ == "__main__":
    main()
