#!/usr/bin/env bash
# The explainer's --execute mode end to end: it starts the mesh's ranks, runs the
# redistribute and must report every planned collective as measured ("ok"), pass its
# checks and exit 0, on a 1-D uneven case, a 2-D case, StridedShard, and a 2-D case from a
# Partial with two collectives. Bad input (bool, which no collective moves; Partial(avg) of int32, which
# truncates) must exit non-zero with a message saying why, before any rank starts.
# Argument: the explain_sharding binary.
set -euo pipefail
bin=$1
out=${TEST_TMPDIR:-/tmp}/explain_sharding_execute_out.txt
err=${TEST_TMPDIR:-/tmp}/explain_sharding_execute_err.txt

# run_ok EXPECTED_OK_ROWS ARGS...: runs with --execute, expects exit 0, "execute: ok", no
# MISMATCH and EXPECTED_OK_ROWS table rows (one per collective step and rank) saying ok.
run_ok() {
  local rows=$1
  shift
  if ! "$bin" "$@" --execute >"$out" 2>"$err"; then
    echo "explain_sharding $* --execute failed:" >&2
    cat "$out" "$err" >&2
    exit 1
  fi
  if grep -q MISMATCH "$out" || ! grep -q "^\[rank0\]: execute: ok$" "$out" ||
     ! grep -q "^\[rank0\]: check: full_tensor() equals the global tensor: ok$" "$out" ||
     ! grep -q "^\[rank0\]: unplanned collectives: none$" "$out"; then
    echo "explain_sharding $* --execute did not report ok:" >&2
    cat "$out" >&2
    exit 1
  fi
  local ok_rows
  ok_rows=$(grep -c ' | ok$' "$out" || true)
  if [[ $ok_rows != "$rows" ]]; then
    echo "explain_sharding $* --execute: $ok_rows rows say ok, expected $rows:" >&2
    cat "$out" >&2
    exit 1
  fi
}

# 10 rows over 4 ranks: chunks 3, 3, 3, 1 padded to 3 rows of 3 float32 (36 B); the
# all_gather's output is 4 blocks (144 B), of which each rank sends 3 (108 B).
run_ok 4 --mesh 4 --shape 10,3 --from S0 --to R
for rank in 0 1 2 3; do
  grep -q "^\[rank0\]:    1 | 0        | all_gather          |    $rank | \[0, 1, 2, 3\] |           108/108 |      1 x 144 B |      1 x 144 B | ok$" "$out"
done
grep -q "^\[rank0\]: check: local tensor equals the rank's target chunk: ok$" "$out"

# 2x2: dim 1 chunks locally, dim 0 all_gathers [4, 3] blocks (48 B) over [0, 2] and [1, 3].
run_ok 4 --mesh 2x2 --names dp,tp --shape 8,6 --from S0,R --to R,S1
grep -q "^\[rank0\]:    2 | 0 (dp)   | all_gather          |    1 | \[1, 3\] |             48/48 |       1 x 96 B |       1 x 96 B | ok$" "$out"

# Merged: both mesh dims gather as one all_gather over the flattened group [0, 1, 2, 3].
run_ok 4 --mesh 2x2 --shape 8,3 --from S0,S0 --to R,R
grep -q "^\[rank0\]:    1 | 0-1      | all_gather          |    2 | \[0, 1, 2, 3\] |" "$out"

# Shard -> Partial pads locally: the plan has no collective, and the values still add up.
run_ok 0 --mesh 2x2 --shape 5,3 --from S0,S1 --to "P(max),S1"

# StridedShard (packed q, k, v rows, uneven over 3 ranks) to Shard: all_gather, then chunk;
# and back from a Partial: one reduce_scatter into each rank's rows of every block.
run_ok 3 --mesh 3 --shape 15,2 --from "SS(0,3)" --to S0
run_ok 3 --mesh 3 --shape 15,2 --from P --to "SS(0,3)"
grep -q "^\[rank0\]: check: local tensor equals the rank's target chunk: ok$" "$out"

# From a Partial, uneven: an all_gather on dim 1, then a reduce_scatter on dim 0.
run_ok 8 --mesh 2x2 --shape 5,6 --from P,S0 --to S1,R --dtype bfloat16

if "$bin" --mesh 4 --shape 10,3 --from S0 --to R --dtype bool --execute >"$out" 2>"$err"; then
  echo "explain_sharding --execute accepted a bool tensor" >&2
  exit 1
fi
grep -q "^explain_sharding: --execute with --dtype bool: collectives move float32, float64, bfloat16, float16, int32 and int64 tensors" "$err"

# An integer average is refused when the spec is made, before any rank starts.
if "$bin" --mesh 2 --shape 4 --from 'P(avg)' --to R --dtype int32 --execute >"$out" 2>"$err"; then
  echo "explain_sharding --execute accepted Partial(avg) of int32" >&2
  exit 1
fi
grep -q "^explain_sharding: DTensorSpec: Partial(avg) on mesh dim 0 of placements (P(avg)) for the int32\[4\] tensor: an average of int32 values truncates" "$err"
if grep -q "executing on" "$out"; then
  echo "explain_sharding started ranks for an invalid spec" >&2
  exit 1
fi
