#!/usr/bin/env bash
# Formats dtr's C++ and CUDA sources (every tracked .h, .cc, .cu and .cuh file) with clang-format 14
# and the repository's .clang-format.
#   tools/format.sh           rewrites the files in place
#   tools/format.sh --check   changes nothing: lists the files that differ, shows the first
#                             differences and exits 1 (tools/test.sh runs this, so CI does)
set -euo pipefail
cd "$(dirname "$0")/.."

clang_format=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z $clang_format ]]; then
  echo "format: clang-format 14 is missing; run tools/setup.sh (it installs Debian's clang-format-14)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')

if [[ ${1:-} != --check ]]; then
  "$clang_format" -i "${files[@]}"
  exit 0
fi

differ=()
for f in "${files[@]}"; do
  if ! "$clang_format" "$f" | cmp -s - "$f"; then differ+=("$f"); fi
done
if ((${#differ[@]} == 0)); then
  echo "format: ${#files[@]} files match .clang-format"
  exit 0
fi
echo "format: ${#differ[@]} of ${#files[@]} files are not formatted; run tools/format.sh to fix them:" >&2
printf '  %s\n' "${differ[@]}" >&2
"$clang_format" "${differ[0]}" | diff -u "${differ[0]}" - | head -n 20 >&2 || true
exit 1
