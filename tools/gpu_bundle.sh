#!/usr/bin/env bash
# gpu_bundle.sh: builds everything dtr's GPU check runs and packs it into one archive that
# runs on an offline GPU host with no compiler, Bazel, package registry or Debian library of
# ours (docs/gpu_bundle.md). The archive unpacks into dtr-gpu-bundle/:
#   gpu_run.sh        the check (tools/gpu_run.sh); --rehearse runs what needs no GPU
#   BUNDLE_INFO       what it was built for: commit, -march, CUDA archs, the CPU flags,
#                     glibc and libstdc++ versions the binaries need
#   binaries.txt      the gpu test binaries, then train, dtrrun, gpu_bench (runfiles paths)
#   lib/              the shared libraries a GPU host lacks (Gloo, fmt, hiredis, ibverbs,
#                     libnl, libgomp; libcudart in lib/cuda/, used where the host has
#                     none); not cuBLAS(Lt), NCCL or the driver
#   runfiles/dtr/     one runfiles tree holding every binary's runfiles (Bazel's _solib_k8
#                     libraries among them) and each binary's .runfiles_manifest
# Usage: tools/gpu_bundle.sh [--test-build] OUT.tar.gz|OUT.tar.zst
#   Builds for sm_90 and x86-64-v3 (AVX2, FMA: no AVX-512, which a GPU host may lack), in
#   an output tree of its own; --test-build packs the test build's binaries instead (this
#   machine's -march=native, sm_80 + sm_90), as tools/test.sh's rehearsal does.
# Fails if the archive is over 55 MiB, the most one upload to the GPU host takes.
set -euo pipefail
cd "$(dirname "$0")/.."

limit_bytes=$((55 * 1024 * 1024))
build_flags=(--copt=-march=x86-64-v3 --define=cuda_archs=sm_90 --platform_suffix=gpu_bundle)
march=x86-64-v3 cuda_archs=sm_90
if [[ ${1:-} == --test-build ]]; then
  build_flags=() march=native cuda_archs="sm_80 sm_90 (+PTX)"
  shift
fi
if (($# != 1)); then
  echo "usage: tools/gpu_bundle.sh [--test-build] OUT.tar.gz|OUT.tar.zst" >&2
  exit 1
fi
out=$1
case $out in
  *.tar.gz) compress=(gzip -6) ;;
  *.tar.zst)
    command -v zstd >/dev/null || {
      echo "gpu_bundle: OUT '$out' asks for zstd, which this machine lacks; use OUT.tar.gz" >&2
      exit 1
    }
    compress=(zstd -q -19 -T0)
    ;;
  *)
    echo "gpu_bundle: OUT '$out' must end in .tar.gz or .tar.zst (the suffix says how it is compressed)" >&2
    exit 1
    ;;
esac
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

# The portable build proves its CPU baseline under qemu-user (below).
if [[ $march == native ]]; then tools/setup.sh; else tools/setup.sh qemu-user; fi
# The bundle: every gpu test that one GPU runs (multi_gpu needs two), then the programs.
mapfile -t tests < <(bazel query --noshow_progress \
  'attr(tags, "\bgpu\b", tests(//...)) except attr(tags, "\bmulti_gpu\b", tests(//...))' | sort)
targets=("${tests[@]}" //tools/train //tools/launcher:dtrrun //tools/bench:gpu_bench)
echo "gpu_bundle: building ${#tests[@]} gpu tests, train, dtrrun and gpu_bench (-march=$march, CUDA $cuda_archs)" >&2
bazel build --noshow_progress --symlink_prefix=/ "${build_flags[@]}" "${targets[@]}"
bin=$(bazel info "${build_flags[@]}" bazel-bin 2>/dev/null)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bundle=$work/dtr-gpu-bundle
mkdir -p "$bundle/lib" "$bundle/runfiles"

# A label's runfiles path: //tools/train -> tools/train/train, //a/b:c -> a/b/c.
path_of() {
  local label=${1#//}
  [[ $label == *:* ]] || label="$label:${label##*/}"
  echo "${label/://}"
}

# One runfiles tree: each file every binary's manifest names, copied once (no symlinks).
: >"$bundle/binaries.txt"
for target in "${targets[@]}"; do
  path=$(path_of "$target")
  echo "$path" >>"$bundle/binaries.txt"
  manifest=$bin/$path.runfiles_manifest
  mkdir -p "$bundle/runfiles/dtr/$(dirname "$path")"
  cp "$manifest" "$bundle/runfiles/dtr/$path.runfiles_manifest"
  while read -r entry source; do
    dest=$bundle/runfiles/$entry
    if [[ -e $dest ]]; then continue; fi
    mkdir -p "$(dirname "$dest")"
    if [[ -z $source ]]; then : >"$dest"; else cp -L "$source" "$dest"; fi
  done <"$manifest"
done
# Read by gpu_run.sh, not by a Bazel target: the PyTorch peer and the Catch2 log counter.
mkdir -p "$bundle/runfiles/dtr/tools/bench/peers"
cp tools/bench/peers/train_gpu_peer.py "$bundle/runfiles/dtr/tools/bench/peers/"
cp tools/count_catch2.py "$bundle/"
cp tools/gpu_run.sh "$bundle/"

# Shared libraries from outside the bundle that a GPU host does not provide, found by the
# loader here. The host provides glibc, libstdc++, libgcc, the driver, cuBLAS(Lt) and NCCL;
# the CUDA runtime too, most likely, but lib/cuda/ keeps this build's as a fallback.
host_provides='linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so'
mkdir -p "$bundle/lib/cuda"
mapfile -t elves < <(find "$bundle/runfiles" -type f \( -name '*.so' -o -perm -u+x \) -exec sh -c \
  'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
for elf in "${elves[@]}"; do ldd "$elf"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u >"$work/resolved"
while read -r soname path; do
  if [[ $soname =~ ^libcudart\.so ]]; then
    cp -L "$path" "$bundle/lib/cuda/$soname"
  elif [[ $path != "$bundle"/* && ! $soname =~ ^($host_provides) && ! -e $bundle/lib/$soname ]]; then
    cp -L "$path" "$bundle/lib/$soname"
  fi
done <"$work/resolved"
cuda_libs=$(awk '$1 ~ /^lib(cudart|cublas|cublasLt|nccl)\.so/ {print $1}' "$work/resolved" | tr '\n' ' ')

# What the host must have: the CPU flags -march enables (named as /proc/cpuinfo names them),
# and the newest glibc and libstdc++ symbol versions any file here needs.
declare -A cpuinfo_flag=([__SSE4_2__]=sse4_2 [__POPCNT__]=popcnt [__AVX__]=avx [__AVX2__]=avx2
  [__FMA__]=fma [__BMI__]=bmi1 [__BMI2__]=bmi2 [__F16C__]=f16c [__LZCNT__]=abm [__MOVBE__]=movbe
  [__AVX512F__]=avx512f [__AVX512CD__]=avx512cd [__AVX512BW__]=avx512bw [__AVX512DQ__]=avx512dq
  [__AVX512VL__]=avx512vl [__AVX512VNNI__]=avx512_vnni [__AVX512BF16__]=avx512_bf16
  [__AVX512FP16__]=avx512_fp16 [__AVX512VBMI__]=avx512vbmi [__AVX512VBMI2__]=avx512_vbmi2
  [__AVX512IFMA__]=avx512ifma [__AVX512BITALG__]=avx512_bitalg
  [__AVX512VPOPCNTDQ__]=avx512_vpopcntdq [__AVXVNNI__]=avx_vnni [__AMX_TILE__]=amx_tile
  [__AMX_BF16__]=amx_bf16 [__AMX_INT8__]=amx_int8 [__GFNI__]=gfni [__VAES__]=vaes
  [__VPCLMULQDQ__]=vpclmulqdq)
cpu_flags=$(gcc -march="$march" -dM -E - </dev/null | awk '{print $2}' | while read -r macro; do
  if [[ -n ${cpuinfo_flag[$macro]:-} ]]; then echo "${cpuinfo_flag[$macro]}"; fi
done | sort | tr '\n' ' ')
needed_version() {
  find "$bundle/runfiles" "$bundle/lib" -type f \( -name '*.so*' -o -perm -u+x \) -exec objdump -p {} + 2>/dev/null |
    grep -oE "\b$1_[0-9]+(\.[0-9]+)*\b" | sort -uV | tail -1
}
cat >"$bundle/BUNDLE_INFO" <<EOF
commit='$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!*.md' || echo +changes)'
built='$(date -u +%Y-%m-%dT%H:%MZ) on $(uname -n)'
march='$march'
cuda_archs='$cuda_archs'
cpu_flags='${cpu_flags% }'
glibc='$(needed_version GLIBC)'
glibcxx='$(needed_version GLIBCXX)'
cuda_libs='${cuda_libs% }'
host_provides='$host_provides'
EOF

# The CPU baseline, proved where it can be: under qemu-user emulating an AVX2-only CPU (AMD
# EPYC Rome: AVX2 and FMA, no AVX-512), train runs two steps on the CPU and each test binary
# lists its cases. An instruction x86-64-v3 lacks dies here with SIGILL, not on the GPU host.
if [[ $march != native ]]; then
  emulate() {
    (cd "$bundle/runfiles/dtr" && LD_LIBRARY_PATH=$bundle/lib:$bundle/lib/cuda qemu-x86_64 -cpu EPYC-Rome "$@") \
      >"$work/qemu.log" 2>&1
  }
  emulate tools/train/train --device cpu --dim 32 --layers 2 --heads 2 --seq-len 16 --batch-size 4 \
    --steps 2 --warmup 1 --log-every 1 --eval-every 0 --threads 1 --out "$work/train" || {
    tail -3 "$work/qemu.log" >&2
    echo "gpu_bundle: train --device cpu failed on an emulated AVX2-only CPU (qemu-x86_64 -cpu EPYC-Rome)" >&2
    exit 1
  }
  for test in "${tests[@]}"; do
    path=$(path_of "$test")
    emulate "$path" --list-tests || true  # Catch2 exits with the number of cases listed
    grep -qE '^[0-9]+ test cases?' "$work/qemu.log" || {
      tail -3 "$work/qemu.log" >&2
      echo "gpu_bundle: $path does not start on an emulated AVX2-only CPU (qemu-x86_64 -cpu EPYC-Rome)" >&2
      exit 1
    }
  done
  echo "gpu_bundle: train and the ${#tests[@]} test binaries run on an emulated AVX2-only CPU (qemu-x86_64 -cpu EPYC-Rome)" >&2
fi

tar -C "$work" -cf - dtr-gpu-bundle | "${compress[@]}" >"$out"
size=$(stat -c %s "$out")
echo "gpu_bundle: $out: $(awk -v b="$size" 'BEGIN {printf "%.1f MiB", b / 1048576}') ($size bytes; limit 55 MiB)," \
  "$(wc -l <"$bundle/binaries.txt") binaries, $(find "$bundle" -type f | wc -l) files," \
  "$(du -sm "$bundle" | cut -f1) MiB unpacked"
if ((size > limit_bytes)); then
  echo "gpu_bundle: $out is over the 55 MiB one upload to the GPU host takes" >&2
  exit 1
fi
