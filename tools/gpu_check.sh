#!/usr/bin/env bash
# The one-command GPU check: on a machine with a GPU, builds everything, runs every test
# tagged gpu (Catch2 cases tagged [gpu], against the CPU kernels; those tagged multi_gpu too
# where two or more GPUs are visible), then the GPU benchmarks
# (tools/bench/gpu_bench: memory-bound kernels against a device copy, matmul against
# cuBLASLt's best algorithm, attention, a training step), the train program under fsdp on
# this GPU at dim 2048, 16 layers, seq 2048, bf16 (tokens/s and MFU; PyTorch's fully_shard on
# the same model beside it when torch is importable), and prints a summary: the GPU,
# the build, test and benchmark times, every benchmark figure, and "N passed, N failed"
# over the gpu tests and the benchmark's checks. Exits non-zero when there is no GPU, the
# build fails, a test fails or a benchmark row is WRONG. Budget: under 5 minutes on one
# H200 with a warm disk cache; --no-bench skips the benchmarks.
set -uo pipefail
cd "$(dirname "$0")/.."
bench=1
[[ ${1:-} == --no-bench ]] && bench=0

if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no GPU visible (nvidia-smi -L failed); nothing to check here" >&2
  exit 1
fi
tools/setup.sh || exit 1
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)

start=$(date +%s)
if ! bazel build //... >/tmp/gpu_check_build.log 2>&1; then
  tail -40 /tmp/gpu_check_build.log
  echo "gpu_check: the build failed (log: /tmp/gpu_check_build.log)" >&2
  exit 1
fi
built=$(date +%s)

# The multi_gpu tests fail, by design, with fewer GPUs than they need: run them on 2 or more.
gpus=$(nvidia-smi -L | grep -c '^GPU')
filter=gpu,-multi_gpu
((gpus >= 2)) && filter=gpu
log=$(mktemp)
bazel test //... --test_tag_filters="$filter" --test_output=errors 2>&1 | tee "$log"
tested=$(date +%s)

passed=0 failed=0
while read -r target result; do
  file="bazel-testlogs/$(sed -e 's|^//||' -e 's|:|/|' <<<"$target")/test.log"
  counts=""
  [[ -f $file ]] && counts=$(python3 tools/count_catch2.py "$file")
  if [[ -n $counts ]]; then
    read -r p f _ <<<"$counts"
    passed=$((passed + p)) failed=$((failed + f))
  elif [[ $result == PASSED ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  echo "gpu_check: $target $result ${counts:+(passed failed skipped: $counts)}"
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|NO STATUS|FAILED TO BUILD|TIMEOUT)' "$log" |
  sed -E 's/ +\(cached\)//' | awk '{print $1, $2}')
rm -f "$log"

bench_log=/tmp/gpu_check_bench.log
: >"$bench_log"
if ((bench)); then
  if bazel-bin/tools/bench/gpu_bench >"$bench_log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "gpu_check: gpu_bench failed or printed WRONG rows (log: $bench_log)" >&2
  fi
fi
# The train program on this GPU at a model sized for it, and PyTorch's fully_shard on the same
# model when torch is importable here (tools/bench/train_gpu_peer.py).
train_model=(--dim 2048 --layers 16 --heads 16 --seq-len 2048 --batch-size 8)
train_log=/tmp/gpu_check_train.log peer_log=/tmp/gpu_check_peer.log
: >"$train_log"
: >"$peer_log"
if ((bench)); then
  if bazel-bin/tools/train/train --device cuda --parallel fsdp --arch gpt --mixed-precision "${train_model[@]}" \
    --steps 12 --warmup 2 --log-every 4 --eval-every 0 --out /tmp/gpu_check_train >"$train_log" 2>&1; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "gpu_check: train --device cuda failed (log: $train_log)" >&2
  fi
  if python3 -c 'import torch' 2>/dev/null; then
    python3 -m torch.distributed.run --standalone --nproc_per_node 1 tools/bench/train_gpu_peer.py \
      "${train_model[@]}" --vocab 256 --steps 10 --warmup 2 >"$peer_log" 2>&1
  else
    echo "torch missing: no PyTorch peer on this machine" >"$peer_log"
  fi
fi
benched=$(date +%s)

echo "gpu_check summary"
echo "  gpu:    $gpu ($gpus visible; tests: --test_tag_filters=$filter)"
echo "  build:  $((built - start)) s; gpu tests: $((tested - built)) s; benchmarks: $((benched - tested)) s"
[[ -s $bench_log ]] && sed 's/^/  /' "$bench_log"
if [[ -s $train_log ]]; then
  echo "  train --device cuda --parallel fsdp --arch gpt --mixed-precision ${train_model[*]}:"
  grep -E '^(device|mfu|model|step) ' "$train_log" | sed 's/^/    /'
  sed -n '/^rank /,/^$/p' "$train_log" | sed 's/^/    /'
  echo "  PyTorch: $(grep -E '^torch' "$peer_log" | tail -1)"
fi
echo "$passed passed, $failed failed"
((failed == 0))
