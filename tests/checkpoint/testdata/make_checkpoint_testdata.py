#!/usr/bin/env python3
"""Full state dicts and Hugging Face's layout between PyTorch and dtr, both directions.

    ~/torch-venv/bin/python3 tests/checkpoint/testdata/make_checkpoint_testdata.py            # writes testdata
    ~/torch-venv/bin/python3 tests/checkpoint/testdata/make_checkpoint_testdata.py --verify DIR

Without arguments it writes, into tests/checkpoint/testdata/hf/, the state dict of a tiny
Transformer (the seed's model as tests/nn/testdata/make_transformer_testdata.py writes it in PyTorch:
vocab 8, dim 8, 1 causal block of 2 heads, 4 positions, a final norm) whose values are a
closed form, exact in float32: the j-th entry of state_dict(), flattened, holds
j + i / 1024 at element i. It writes it twice:
  torch_model.safetensors  with safetensors.torch.save_file;
  dcp_hf/                  with torch.distributed.checkpoint's HuggingFaceStorageWriter
                           (three files model-0000k-of-00003.safetensors and
                           model.safetensors.index.json).
tests/checkpoint/full_state_dict_file_test.cc loads both into sharded dtr models and checks the
closed form.

With --verify DIR it reads what dtr wrote there (that test writes it when
DTR_CHECKPOINT_INTEROP_DIR names a directory): DIR/model.safetensors (save_full_state_dict)
with safetensors.torch.load_file, DIR/hf/ (save_hf_checkpoint) with dcp.load through
HuggingFaceStorageReader and with the index read by hand, and DIR/sharded/ (checkpoint::save
by 3 ranks, each rank file holding its shards with their offsets in DCP_SHARDING_INFO) with
dcp.load through HuggingFaceStorageReader; it checks every name, shape, dtype and value
against the closed form and the index's total_size, and exits non-zero on a mismatch.

Made with torch 2.15.0 and safetensors 0.8.0, on the CPU, without a process group.
"""
import json
import pathlib
import shutil
import sys

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "nn/testdata"))
from make_transformer_testdata import Transformer  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[3] / "tests/checkpoint/testdata/hf"


def closed_form_state():
    torch.manual_seed(0)
    model = Transformer(8, 8, 1, 2, causal=True, max_seq_len=4, final_norm=True)
    state = {}
    for j, (name, value) in enumerate(model.state_dict().items()):
        flat = j + torch.arange(value.numel(), dtype=torch.float64) / 1024
        state[name] = flat.reshape(value.shape).to(value.dtype).contiguous()
    return state


def write_testdata() -> None:
    state = closed_form_state()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    save_file(state, str(OUT / "torch_model.safetensors"), metadata={"format": "pt"})
    names = list(state)
    # Three files, entries in order, as Hugging Face's shards are.
    mapping = {name: 1 + 3 * i // len(names) for i, name in enumerate(names)}
    dcp.save(state, storage_writer=HuggingFaceStorageWriter(path=str(OUT / "dcp_hf"), fqn_to_index_mapping=mapping))
    for path in sorted(OUT.rglob("*")):
        if path.is_file():
            print(f"wrote {path.relative_to(OUT)} ({path.stat().st_size} bytes)")


def check(label, got, expected) -> list:
    problems = []
    if set(got) != set(expected):
        problems.append(f"{label}: names differ: missing {sorted(set(expected) - set(got))}, "
                        f"unexpected {sorted(set(got) - set(expected))}")
    for name in sorted(set(got) & set(expected)):
        g, e = got[name], expected[name]
        if g.dtype != e.dtype or g.shape != e.shape:
            problems.append(f"{label}: {name} is {g.dtype}{tuple(g.shape)}, expected {e.dtype}{tuple(e.shape)}")
        elif not torch.equal(g, e):
            problems.append(f"{label}: {name} differs, max |diff| {(g - e).abs().max().item()}")
    print(f"{label}: {len(got)} tensors checked, {len(problems)} problems")
    return problems


def verify(directory: pathlib.Path) -> int:
    expected = closed_form_state()
    problems = check("safetensors.torch.load_file(model.safetensors)",
                     load_file(str(directory / "model.safetensors")), expected)
    hf = directory / "hf"
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    print(f"index: {len(index['weight_map'])} names in {len(files)} files {files}, "
          f"total_size {index['metadata']['total_size']}")
    total = sum(t.numel() * t.element_size() for t in expected.values())
    if index["metadata"]["total_size"] != total:
        problems.append(f"index total_size {index['metadata']['total_size']}, expected {total}")
    by_hand = {}
    for name in files:
        tensors = load_file(str(hf / name))
        for key, value in tensors.items():
            if index["weight_map"].get(key) != name:
                problems.append(f"{key} is in {name}, the index says {index['weight_map'].get(key)}")
        by_hand.update(tensors)
    problems += check("load_file of each file the index names", by_hand, expected)
    loaded = {name: torch.zeros_like(t) for name, t in expected.items()}
    dcp.load(loaded, storage_reader=HuggingFaceStorageReader(path=str(hf)))
    problems += check("dcp.load with HuggingFaceStorageReader(hf/)", loaded, expected)
    sharded = {name: torch.zeros_like(t) for name, t in expected.items()}
    dcp.load(sharded, storage_reader=HuggingFaceStorageReader(path=str(directory / "sharded")))
    problems += check("dcp.load with HuggingFaceStorageReader(sharded/, 3 dtr ranks' files)", sharded, expected)
    for p in problems:
        print("MISMATCH", p)
    print("OK" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--verify":
        return verify(pathlib.Path(sys.argv[2]))
    if len(sys.argv) != 1:
        print(__doc__)
        return 2
    write_testdata()
    return 0


if __name__ == "__main__":
    sys.exit(main())
