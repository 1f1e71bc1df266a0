#!/usr/bin/env bash
# The one-command GPU check: on a machine with a GPU, builds everything, runs every test
# tagged gpu (Catch2 cases tagged [gpu], against the CPU kernels), then the GPU benchmarks
# (tools/bench/gpu_bench: memory-bound kernels against a device copy, matmul against
# cuBLASLt's best algorithm, attention, a training step), and prints a summary: the GPU,
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

log=$(mktemp)
bazel test //... --test_tag_filters=gpu --test_output=errors 2>&1 | tee "$log"
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
benched=$(date +%s)

echo "gpu_check summary"
echo "  gpu:    $gpu"
echo "  build:  $((built - start)) s; gpu tests: $((tested - built)) s; benchmarks: $((benched - tested)) s"
[[ -s $bench_log ]] && sed 's/^/  /' "$bench_log"
echo "$passed passed, $failed failed"
((failed == 0))
