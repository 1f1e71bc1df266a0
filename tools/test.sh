#!/usr/bin/env bash
# Runs the whole dtr test suite: sets up the machine if needed, builds everything
# (CUDA sources included), runs every test tagged neither gpu nor multi_gpu, and ends
# with the line "N passed, N failed" counting Catch2 test cases (a target that fails to
# build or run without reporting counts as one failure). Extra arguments go to `bazel
# test`. `tools/test.sh --gpu` also runs the tests tagged gpu (a machine with a GPU);
# `tools/test.sh --multi-gpu` runs those and the ones tagged multi_gpu too (two or more
# GPUs: a multi_gpu test fails, never passes, on a machine with fewer). The format check
# (tools/format.sh --check) and the layering check (tools/check_layers.py, docs/architecture.md)
# run after the tests and count as one test each; then the GPU bundle's
# rehearsal (docs/gpu_bundle.md): the gpu tests and programs this build made, packed by
# tools/gpu_bundle.sh --test-build, unpacked elsewhere and checked by the bundle's own
# `gpu_run.sh --rehearse`, whose cases count here (packing failures count as one); then every
# block of README.md and docs/train.md marked runnable (tools/run_doc_blocks.sh), one case
# each. A Catch2 test case that cannot run on this machine warns "SKIPPED: <why>"
# (tools/count_catch2.py); it counts as neither passed nor failed, and a line before the
# last one names its target.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh || exit 1

filter=(--test_tag_filters=-gpu,-multi_gpu)
case ${1:-} in
  --gpu) filter=(--test_tag_filters=-multi_gpu); shift ;;
  --multi-gpu) filter=(); shift ;;
esac

log=$(mktemp)
bazel test //... "${filter[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

passed=0 failed=0
if tools/format.sh --check; then passed=1; else failed=1; fi
if python3 tools/check_layers.py; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

while read -r target result; do
  file="bazel-testlogs/$(sed -e 's|^//||' -e 's|:|/|' <<<"$target")/test.log"
  counts=""
  if [[ $result == PASSED || $result == FAILED ]] && [[ -f $file ]]; then
    counts=$(python3 tools/count_catch2.py "$file")
  fi
  if [[ -n $counts ]]; then
    read -r p f s <<<"$counts"
    passed=$((passed + p)) failed=$((failed + f))
    if ((s > 0)); then echo "$target: $s test case(s) skipped, see $file"; fi
  elif [[ $result == PASSED ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY)' "$log" |
  sed -E 's/\(cached\) //' | awk '{print $1, $2}')
rm -f "$log"

# Adds the counts of FILE's last line, "N passed, N failed"; a step that printed none failed.
add_counts() {
  local p="" f=""
  read -r p _ f _ < <(tail -1 "$1" 2>/dev/null | grep -oE '[0-9]+ passed, [0-9]+ failed$')
  if [[ -n $p ]]; then passed=$((passed + p)) failed=$((failed + f)); else failed=$((failed + 1)); fi
}
steps=$(mktemp -d)

# Bazel cannot run inside a Bazel test, so the bundle is rehearsed here, from this build.
if tools/gpu_bundle.sh --test-build "$steps/dtr-gpu.tar.gz" && tar -C "$steps" -xzf "$steps/dtr-gpu.tar.gz"; then
  "$steps/dtr-gpu-bundle/gpu_run.sh" --rehearse --logs "$steps/logs" 2>&1 | sed 's/^/rehearsal: /' | tee "$steps/rehearsal"
fi
add_counts "$steps/rehearsal"

# The README's and docs/train.md's runnable blocks, each one case (tools/run_doc_blocks.sh).
tools/run_doc_blocks.sh README.md docs/train.md 2>&1 | sed 's/^/docs: /' | tee "$steps/docs"
add_counts "$steps/docs"
rm -rf "$steps"

echo "$passed passed, $failed failed"
if ((status != 0 || failed != 0)); then exit 1; fi
