#!/usr/bin/env bash
# The one-command GPU check: on a machine with a GPU, builds everything, runs every test
# tagged gpu (Catch2 cases tagged [gpu], against the CPU kernels), and prints a summary:
# the GPU, the build and test times, and "N passed, N failed" over the gpu tests. Exits
# non-zero when there is no GPU, the build fails or a test fails. The GPU benchmarks join
# the summary as they are written (issue: CUDA part 1). Budget: under 5 minutes on one H200
# with a warm disk cache.
set -uo pipefail
cd "$(dirname "$0")/.."

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

echo "gpu_check summary"
echo "  gpu:    $gpu"
echo "  build:  $((built - start)) s; gpu tests: $((tested - built)) s"
echo "$passed passed, $failed failed"
((failed == 0))
