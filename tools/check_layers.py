#!/usr/bin/env python3
"""Checks the layering of docs/architecture.md: no file includes, and no Bazel target
depends on, a higher layer, and no file includes another folder's internal/ headers.

    python3 tools/check_layers.py      # from the checkout; exit 1 and one line per breach

It reads the source (every `#include "..."` of the C++ and CUDA files) and every BUILD file
(each label outside a visibility list), so it needs no build. tools/test.sh runs it as one
case.
"""
import pathlib
import re
import sys

# What each layer may use, itself included (docs/architecture.md's table).
BASE = {"core"}
ALLOWED = {
    "core": BASE,
    "kernels": BASE | {"kernels"},
    "collectives": BASE | {"collectives"},
    "dtensor": BASE | {"kernels", "collectives", "dtensor"},
    "nn": BASE | {"kernels", "collectives", "dtensor", "nn"},
    "optim": BASE | {"kernels", "collectives", "dtensor", "optim"},
    "checkpoint": BASE | {"kernels", "collectives", "dtensor", "nn", "optim", "checkpoint"},
}
LAYERS = set(ALLOWED)
ALLOWED["tools"] = LAYERS | {"tools"}
ALLOWED["tests"] = LAYERS | {"tools", "tests"}

SOURCES = {".h", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
LABEL = re.compile(r'"//([a-z_0-9/]+)')
VISIBILITY = re.compile(r"visibility\s*=\s*(\[[^\]]*\]|[A-Za-z_]+)", re.S)
PACKAGE_GROUP = re.compile(r"package_group\((?:[^()]|\([^()]*\))*\)", re.S)
LIST_CONSTANT = re.compile(r"^[A-Z_]+ = \[[^\]]*\]", re.M)  # visibility lists named once a file
BUILD_MACROS = "tools/bazel"  # the Bazel macros every layer loads


def layer_of(path: str) -> str:
    return path.split("/", 1)[0]


def internal_owner(include: str) -> str | None:
    """The folder whose internal/ holds `include`, or None for a public header."""
    parts = include.split("/")
    return "/".join(parts[: parts.index("internal")]) if "internal" in parts[:-1] else None


def may_include_internal(path: str, owner: str) -> bool:
    # A folder's internal/ serves that folder's tree and that folder's tests.
    return path.startswith(owner + "/") or path.startswith("tests/" + owner.split("/", 1)[0] + "/")


def check(root: pathlib.Path) -> list[str]:
    breaches = []
    for layer in ALLOWED:
        for file in sorted((root / layer).rglob("*")):
            rel = file.relative_to(root).as_posix()
            if file.suffix in SOURCES:
                for n, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m or "/" not in m.group(1):
                        continue
                    target = layer_of(m.group(1))
                    if target in ALLOWED and target not in ALLOWED[layer]:
                        breaches.append(f"{rel}:{n}: {layer}/ includes {m.group(1)} from the higher layer {target}/")
                    owner = internal_owner(m.group(1))
                    if owner and not may_include_internal(rel, owner):
                        breaches.append(f"{rel}:{n}: includes {m.group(1)}, internal to {owner}/")
            elif file.name == "BUILD":
                text = LIST_CONSTANT.sub("", PACKAGE_GROUP.sub("", VISIBILITY.sub("", file.read_text())))
                for m in LABEL.finditer(text):
                    if m.group(1).startswith(BUILD_MACROS):
                        continue
                    target = layer_of(m.group(1))
                    if target in ALLOWED and target not in ALLOWED[layer]:
                        breaches.append(f"{rel}: {layer}/ depends on //{m.group(1)} from the higher layer {target}/")
    return breaches


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    breaches = check(root)
    for b in breaches:
        print(b)
    print(f"check_layers: {len(breaches)} breach(es) of docs/architecture.md's layering")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
