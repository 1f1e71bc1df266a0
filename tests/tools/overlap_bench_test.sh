#!/usr/bin/env bash
# overlap_bench end to end at its smallest (one timed step per setting, a tiny overlap
# pair): it launches its 2 ranks, prints every row of its three tables, its goal line, and
# its check that every FSDP setting trained to the same loss says ok; it exits 0. Bad
# options exit non-zero before any rank starts. Timings are printed, never asserted.
# Argument: the overlap_bench binary.
set -euo pipefail
bin=$1
out=${TEST_TMPDIR:-/tmp}/overlap_bench_out.txt

fail() {
  echo "overlap_bench: $1" >&2
  cat "$out" >&2
  exit 1
}

if ! "$bin" --steps 1 --warmup 1 --tracer-cycles 1 --pair-dim 32 --pair-mib 0.01,0.1 --pair-repeats 1 >"$out" 2>&1; then
  fail "failed"
fi
grep -q "^\[rank0\]: check: every row's loss after its last step is bitwise the first row's: ok$" "$out" ||
  fail "no ok loss check"
grep -Eq "^\[rank0\]: goal: with prefetch, exposed communication under 20% of the step at 2 ranks: worst .*: (met|NOT met)$" "$out" ||
  fail "no goal line"
for prefetch in "implicit  " "explicit 1" "explicit 2" "off       "; do
  for reshard in "true " "false"; do
    # ms/step, comm ms, exposed ms, exposed %, hidden %, 4 phases, peak MiB: all numbers.
    grep -Eq "^\[rank0\]: $prefetch \| $reshard   \|( +[0-9.]+%? \|){9} +[0-9.]+$" "$out" ||
      fail "no row for prefetch '$prefetch', reshard '$reshard'"
  done
done
for mode in "off" "comm categories (train)" "every category (--trace)"; do
  grep -Eq "^\[rank0\]: $(printf '%-26s' "$mode" | sed 's/[()]/\\&/g') \| +[0-9.]+ \| +[0-9.]+$" "$out" ||
    fail "no tracer cost row '$mode'"
done
grep -Eq "^one span: [0-9.]+ ns with tracing off, [0-9.]+ ns recording" "$out" || fail "no span cost"
pairs=$(grep -Ec "^\[rank0\]: +[0-9.]+ \|( +[0-9.]+ \|){5} +[0-9.]+%$" "$out" || true)
[[ $pairs == 2 ]] || fail "$pairs overlap rows, expected 2"

for bad in "--ranks 1" "--pair-mib 0" "--steps 0"; do
  # shellcheck disable=SC2086
  if "$bin" $bad >"$out" 2>&1; then fail "$bad exited 0"; fi
  grep -q "\[rank" "$out" && fail "$bad started ranks"
done
echo "overlap_bench_test: ok"
