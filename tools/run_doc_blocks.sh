#!/usr/bin/env bash
# run_doc_blocks.sh FILE...: runs every fenced shell block marked runnable in the Markdown
# FILEs (an opening fence of exactly "```sh runnable"; GitHub shows it as sh), each with
# bash -euo pipefail from the checkout root, so the commands the README and the guides show
# cannot rot. A block is one case: it passes when every command in it exits 0. Prints one
# line per block and ends with "N passed, N failed" (tools/test.sh runs it). Blocks that
# need a GPU or two hosts are left unmarked.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
logs=$(mktemp -d)
passed=0 failed=0
for file in "$@"; do
  block="" start=0 n=0 line_no=0
  while IFS= read -r line || [[ -n $line ]]; do
    line_no=$((line_no + 1))
    if ((start == 0)) && [[ $line == '```sh runnable' ]]; then
      start=$line_no block=""
    elif ((start > 0)) && [[ $line == '```' ]]; then
      n=$((n + 1))
      log=$logs/$(basename "$file" .md)_$n.log
      if bash -euo pipefail -c "$block" </dev/null >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "doc block $file:$start: ok"
      else
        failed=$((failed + 1))
        echo "doc block $file:$start: FAILED; its last lines:"
        tail -5 "$log" | sed 's/^/  /'
      fi
      start=0
    elif ((start > 0)); then
      block+="$line"$'\n'
    fi
  done <"$file"
done
rm -rf "$logs"
echo "$passed passed, $failed failed"
((failed == 0))
