#!/usr/bin/env bash
# The README's first command: sets up the machine if needed (tools/setup.sh, once), builds
# the train program and the launcher, and trains on N CPU ranks (default 2) with dtrrun,
# passing every other argument to train (`tools/train.sh --help` lists them).
#   tools/train.sh [--nproc N] [train flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
nproc=2
if [[ ${1:-} == --nproc ]]; then
  nproc=$2
  shift 2
fi
# Progress every 15 s: the first build takes minutes on 2 cores.
bazel build --show_progress_rate_limit=15 --ui_event_filters=-info //tools/train //tools/launcher:dtrrun >&2
exec bazel-bin/tools/launcher/dtrrun --nproc-per-node "$nproc" bazel-bin/tools/train/train "$@"
