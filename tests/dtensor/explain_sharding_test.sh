#!/usr/bin/env bash
# The explainer end to end: its output for one fixed case (uneven, nested, ending in a
# Partial) must equal the golden text, and a bad placement must exit non-zero with a
# message that names it. Arguments: the explain_sharding binary, the golden file.
set -euo pipefail
bin=$1
golden=$2
diff -u "$golden" <("$bin" --mesh 2x2 --names dp,tp --shape 5,6 --from S0,S0 --to P,S1)
err=${TEST_TMPDIR:-/tmp}/explain_sharding_err.txt
if "$bin" --mesh 2x2 --shape 5 --from S1,R --to R,R 2>"$err"; then
  echo "explain_sharding accepted Shard(dim=1) on a 1-d tensor" >&2
  exit 1
fi
grep -q "Shard(dim=1) on mesh dim 0 of placements (S(1), R) is out of range" "$err"
# An empty --shape and P() are errors that say what is legal.
if "$bin" --mesh 2 --shape "" --from S0 --to R 2>"$err"; then
  echo "explain_sharding accepted an empty --shape" >&2
  exit 1
fi
grep -q "give the global tensor's sizes as non-negative integers separated by commas" "$err"
if "$bin" --mesh 2 --shape 4 --from "P()" --to R 2>"$err"; then
  echo "explain_sharding accepted P()" >&2
  exit 1
fi
grep -q "'P()' names no reduce op; write P or P(sum)" "$err"
"$bin" --mesh 2 --shape scalar --from "P(max)" --to R | grep -q "all_reduce(max)"
# A malformed or huge --mesh is one line and exit code 1, not a silent 1-D mesh or bad_alloc.
for mesh in 2x x2 2x0 100000x100000; do
  status=0
  "$bin" --mesh "$mesh" --shape 8 --from S0 --to R 2>"$err" || status=$?
  if ((status != 1)) || [[ $(wc -l <"$err") != 1 ]]; then
    echo "explain_sharding --mesh $mesh: exit $status, $(wc -l <"$err") lines on stderr" >&2
    exit 1
  fi
  grep -q "^explain_sharding: --mesh '$mesh': give the mesh's sizes, each >= 1, joined by x" "$err"
done
# --view: FSDP x TP's tp-first mesh, ranks numbered as in the (dp, tp) mesh: an 11-row
# vocabulary's tp pieces (6 + 5 rows) chunked over dp; rank 1 (dp 0, tp 1) holds rows 6:9.
out=${TEST_TMPDIR:-/tmp}/explain_sharding_view.txt
"$bin" --mesh 2x2 --names dp,tp --view tp,dp --shape 11,8 --from S0,S0 --to S0,R >"$out"
grep -q "^source: float32\[11, 8\] (S(0), S(0)) on DeviceMesh('cpu', \[\[0, 2\], \[1, 3\]\], mesh_dim_names=('tp', 'dp'))" "$out"
grep -q "^1    | (1, 0) | 6:9   | 0:8   | \[3, 8\]" "$out"
grep -q "mesh dim 1 (dp): S(0) -> R, all_gather over groups \[\[0, 2\], \[1, 3\]\]" "$out"
# --alternatives lists the plans weighed and the reason for the choice.
out=${TEST_TMPDIR:-/tmp}/explain_sharding_alternatives.txt
"$bin" --mesh 2x2 --shape 5,3 --from S0,S0 --to R,R --alternatives >"$out"
grep -q "^2 plans considered for float32\[5, 3\] (S(0), S(0))" "$out"
grep -q "^chosen: plan 2: the fewest bytes sent by the busiest rank (60 against 72)" "$out"
# --cost-model prints each collective's bytes and predicted time (100 us + 32 B / 1 GB/s), and
# a bad model file is an error naming it.
model=${TEST_TMPDIR:-/tmp}/explain_sharding_cost_model.json
cat >"$model" <<'JSON'
{"format": "dtr-cost-model", "version": 1, "machine": "test", "backend": "gloo",
 "fits": [{"kind": "all_gather", "group_size": 2, "alpha_s": 1e-4, "beta_bytes_per_s": 1e9}]}
JSON
"$bin" --mesh 2 --shape 4,2 --from S0 --to R --cost-model "$model" >"$out"
grep -q "^  step 1: mesh dim 0: S(0) -> R, all_gather over groups \[\[0, 1\]\]: 32 B per rank ~100.0 us$" "$out"
grep -q "^predicted time: ~100.0 us (cost model: test, gloo)$" "$out"
echo '{"format": "dtr-cost-model", "version": 1}' >"$model"
if "$bin" --mesh 2 --shape 4,2 --from S0 --to R --cost-model "$model" 2>"$err"; then
  echo "explain_sharding accepted a cost model file with no fits" >&2
  exit 1
fi
grep -q "CostModel::load: '$model' is not a cost model file" "$err"
# --deterministic says how the mode runs each sum: in the canonical tree over more than two
# ranks (an all_to_all, and an all_gather for an all-reduce), as planned over two; it plans
# as the mode does (a Partial's mesh dims reduced innermost first: on 2 x 2 both in one
# collective, where the plain plan goes outermost first; an inner all-reduce before an outer
# reduce-scatter, which the plain plan runs first), and it does not go with --execute.
"$bin" --mesh 4 --shape 8,2 --from P --to S0 --deterministic >"$out"
grep -q "reduce_scatter(sum) over groups \[\[0, 1, 2, 3\]\]; deterministic: in the canonical tree of the group's members instead: an all_to_all of their blocks, each rank summing the blocks of its part in the tree, the ring's bytes per rank$" "$out"
"$bin" --mesh 4 --shape 8,2 --from P --to R --deterministic >"$out"
grep -q "in the tree, then an all_gather of the parts, the ring's bytes per rank$" "$out"
"$bin" --mesh 2 --shape 8,2 --from P --to R --deterministic >"$out"
grep -q "deterministic: as planned (two ranks: one addition, the canonical tree's)$" "$out"
"$bin" --mesh 2x2 --shape 1 --from P,P --to R,R --deterministic >"$out"
grep -q "step 1: mesh dims 0-1: P(sum) -> R, all_reduce(sum) over groups \[\[0, 1, 2, 3\]\]" "$out"
"$bin" --mesh 2x2 --shape 12,12 --from P,P --to S0,R --deterministic >"$out"
grep -q "step 1: mesh dim 1: P(sum) -> R, all_reduce(sum) over groups \[\[0, 1\], \[2, 3\]\]" "$out"
"$bin" --mesh 2x2 --shape 1 --from P,P --to R,R >"$out"
grep -q "step 1: mesh dim 0: P(sum) -> R, all_reduce(sum) over groups \[\[0, 2\], \[1, 3\]\]" "$out"
"$bin" --mesh 4 --shape 8,2 --from P --to R >"$out"
grep -q "all_reduce(sum) over groups" "$out"
if grep -q "deterministic" "$out"; then
  echo "explain_sharding spoke of --deterministic without the flag" >&2
  exit 1
fi
if "$bin" --mesh 4 --shape 8,2 --from P --to R --deterministic --execute 2>"$err"; then
  echo "explain_sharding accepted --execute with --deterministic" >&2
  exit 1
fi
grep -q "^explain_sharding: --execute with --deterministic: " "$err"
