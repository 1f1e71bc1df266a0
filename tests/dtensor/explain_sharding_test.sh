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
