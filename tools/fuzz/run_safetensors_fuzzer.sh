#!/usr/bin/env bash
# Fuzzes the .safetensors header parser with libFuzzer (Debian's clang), with address and
# undefined-behaviour sanitizers, starting from and growing the corpus that
# tests/checkpoint/safetensors_test replays on every test run; then merges the corpus down to the
# inputs that add coverage.
#
#   tools/fuzz/run_safetensors_fuzzer.sh [SECONDS]   (default 60)
#
# Needs Debian's clang (apt-get install clang), which the build itself does not.
set -euo pipefail
command -v clang++ >/dev/null || { echo "run_safetensors_fuzzer: clang++ is missing; apt-get install clang" >&2; exit 2; }
cd "$(dirname "$0")/../.."
seconds=${1:-60}
corpus=tests/checkpoint/testdata/safetensors_corpus
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
  tools/fuzz/safetensors_fuzzer.cc checkpoint/safetensors_header.cc checkpoint/safetensors_dtype.cc -lfmt -o "$build/fuzzer"
mkdir -p "$build/new"
"$build/fuzzer" -max_total_time="$seconds" -max_len=4096 -timeout=5 "$build/new" "$corpus"
mkdir -p "$build/merged"
"$build/fuzzer" -merge=1 "$build/merged" "$corpus" "$build/new"
rm -f "$corpus"/*
cp "$build/merged"/* "$corpus"/
echo "corpus: $(ls "$corpus" | wc -l) inputs in $corpus"
