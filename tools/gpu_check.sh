#!/usr/bin/env bash
# The one-command GPU check on a machine with a GPU and this checkout: builds the GPU bundle
# (tools/gpu_bundle.sh: sm_90, x86-64-v3), unpacks it and runs its gpu_run.sh, the same check
# that a GPU host without Bazel runs from the archive alone (docs/gpu_bundle.md): the gpu
# tests, gpu_bench, the train row and PyTorch's fully_shard beside it, a summary and
# "N passed, N failed". Logs go to /tmp/gpu_check_logs; arguments go to gpu_run.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU visible (nvidia-smi -L failed); nothing to check here (tools/gpu_bundle.sh packs the check for a GPU host)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tools/gpu_bundle.sh "$work/dtr-gpu.tar.gz" || exit 1
tar -C "$work" -xzf "$work/dtr-gpu.tar.gz" || exit 1
"$work/dtr-gpu-bundle/gpu_run.sh" --logs /tmp/gpu_check_logs "$@"
