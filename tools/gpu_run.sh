#!/usr/bin/env bash
# gpu_run.sh: dtr's GPU check, run from an unpacked GPU bundle (tools/gpu_bundle.sh) on a
# host with a GPU and no compiler, Bazel or network (docs/gpu_bundle.md). In order:
#   1. preflight: the CPU flags, glibc and libstdc++ the bundle needs (BUNDLE_INFO) and the
#      driver, each stopping with one line if missing; the CUDA libraries (cuBLASLt, NCCL,
#      the CUDA runtime) found and printed with NCCL's and the driver's versions; every
#      binary's libraries resolved by the loader inside the bundle or to what the host
#      provides (one case per binary);
#   2. every Catch2 case of the gpu test binaries; on one GPU the [multi_gpu] cases, which
#      need two, are reported skipped;
#   3. gpu_bench; 4. train --device cuda --parallel fsdp --mixed-precision on a model sized
#      for the GPU; 5. PyTorch's fully_shard on the same model, where torch imports;
# each under its own timeout (the budget below: 8 minutes in all on one H200), then a
# summary and the line "N passed, N failed". Step logs go to --logs DIR (default logs/).
# --rehearse needs no GPU (tools/test.sh runs it): the preflight without the driver, every
# runfiles entry each binary names present, each binary loading with every symbol bound
# (LD_BIND_NOW=1 ... --list-tests or --help), and dtrrun + train --device cpu training a
# few steps; each a case.
# shellcheck disable=SC2154  # the variables BUNDLE_INFO sets (sourced below)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mode=run logs=$here/logs
while (($#)); do
  case $1 in
    --rehearse) mode=rehearse ;;
    --logs) logs=${2:?--logs needs a directory}; shift ;;
    *)
      echo "gpu_run: unknown argument '$1' (legal: --rehearse, --logs DIR)" >&2
      exit 1
      ;;
  esac
  shift
done
# BUNDLE_INFO (written by gpu_bundle.sh) sets commit, built, march, cuda_archs, cpu_flags,
# glibc, glibcxx, cuda_libs and host_provides.
# shellcheck source=/dev/null
source "$here/BUNDLE_INFO"
mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
root=$here/runfiles/dtr
mapfile -t binaries <"$here/binaries.txt"
tests=() tools=()
for bin in "${binaries[@]}"; do
  if [[ $bin == tests/* ]]; then tests+=("$bin"); else tools+=("$bin"); fi
done

# Seconds each step may take (run mode); the tests share one pool, a binary at most
# test_limit of it. Worst case, with the preflight's few seconds: under 8 minutes.
test_pool=210 test_limit=120 bench_limit=90 train_limit=75 peer_limit=75

start=$SECONDS
passed=0 failed=0 skipped=0
report=()
# record PASS|FAIL|SKIP NAME DETAIL [CASES]: a line of the summary counting CASES (1) cases.
record() {
  case $1 in
    PASS) passed=$((passed + ${4:-1})) ;;
    FAIL) failed=$((failed + ${4:-1})) ;;
    SKIP) skipped=$((skipped + ${4:-1})) ;;
  esac
  report+=("$(printf '%-4s %-46s %s' "$1" "$2" "$3")")
  echo "gpu_run: $1 $2 $3"
}
stop() {
  echo "gpu_run: $*" >&2
  exit 1
}

# ---- 1. preflight -------------------------------------------------------------------------
cpu=$(grep -m1 '^flags' /proc/cpuinfo)
missing=()
for flag in $cpu_flags; do [[ " ${cpu#*:} " == *" $flag "* ]] || missing+=("$flag"); done
((${#missing[@]} == 0)) ||
  stop "this CPU lacks ${missing[*]}, which the bundle's code uses (built with -march=$march; rebuild with tools/gpu_bundle.sh, whose x86-64-v3 build needs AVX2 and FMA only)"
have_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
need_glibc=${glibc#GLIBC_}
[[ $(printf '%s\n' "$need_glibc" "$have_glibc" | sort -V | head -1) == "$need_glibc" ]] ||
  stop "glibc $have_glibc here; the bundle's binaries need glibc >= $need_glibc"
libstdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
for candidate in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6 /lib64/libstdc++.so.6; do
  [[ -n $libstdcxx ]] && break
  [[ -e $candidate ]] && libstdcxx=$candidate
done
command -v python3 >/dev/null || stop "no python3 on PATH; gpu_run.sh needs it to count Catch2's results"
[[ -n $libstdcxx ]] || stop "no libstdc++.so.6 on this host; the bundle's binaries need one with $glibcxx"
grep -qaF "$glibcxx" "$libstdcxx" || stop "$libstdcxx lacks $glibcxx, which the bundle's binaries need (GCC 12's libstdc++ or newer)"

gpu="none (rehearsal)" driver_cuda="" gpus=""
if [[ $mode == run ]]; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $gpu ]] || stop "no GPU or NVIDIA driver: nvidia-smi --query-gpu failed (the check needs one GPU)"
  driver_cuda=$(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: *[0-9.]+' | awk '{print $NF}')
  gpus=$(nvidia-smi -L | grep -c '^GPU')
fi

# The CUDA libraries the binaries link (cuda_libs): CUDA_HOME, /usr/local/cuda*, the Python
# packages' nvidia/*/lib, the loader's cache; the CUDA runtime falls back to the bundle's.
search=()
[[ -n ${CUDA_HOME:-} ]] && search+=("$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib")
search+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64
  /usr/local/cuda-*/targets/x86_64-linux/lib)
while read -r site; do search+=("$site"/nvidia/*/lib); done < <(python3 -c \
  'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
ld_path=("$here/lib")
for soname in $cuda_libs; do
  found=""
  for dir in "${search[@]}"; do
    if [[ -e $dir/$soname ]]; then found=$dir/$soname && break; fi
  done
  [[ -n $found ]] || found=$(ldconfig -p 2>/dev/null | awk -v lib="$soname" '$1 == lib && /x86-64/ {print $NF; exit}')
  [[ -z $found || -e $found ]] || found=""  # the loader's cache may name a file since removed
  [[ -n $found || ! -e $here/lib/cuda/$soname ]] || found=$here/lib/cuda/$soname
  [[ -n $found ]] || stop "$soname not found under \$CUDA_HOME, /usr/local/cuda*, python3's nvidia/*/lib or ldconfig's cache (it comes with the CUDA toolkit or NVIDIA's pip packages; set CUDA_HOME)"
  dir=$(dirname "$found")
  [[ " ${ld_path[*]} " == *" $dir "* ]] || ld_path+=("$dir")
done
LD_LIBRARY_PATH=$(
  IFS=:
  echo "${ld_path[*]}"
)
export LD_LIBRARY_PATH
ldso=/lib64/ld-linux-x86-64.so.2
# What the loader resolves for a file, one "soname path" a line (path "not-found" if none).
resolve() {
  env -i LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$ldso" --list "$1" 2>&1 | awk '
    /error while loading shared libraries: / { sub(/.*shared libraries: /, ""); sub(/:.*/, ""); print $0, "not-found"; next }
    $2 == "=>" { print $1, ($3 == "not" ? "not-found" : $3) }'
}
cuda_resolved=$(resolve "$root/tools/train/train" | grep -E "^($(tr ' ' '|' <<<"$cuda_libs")) ")
nccl=$(awk '$1 ~ /^libnccl/ {print $2}' <<<"$cuda_resolved")
nccl_version=$(python3 -c 'import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print("{}.{}.{}".format(v.value // 10000, v.value // 100 % 100, v.value % 100))' "$nccl" 2>/dev/null || echo unknown)

echo "gpu_run: $mode of bundle $commit (built $built; -march=$march, CUDA $cuda_archs)"
echo "gpu_run: host: $(uname -srm), glibc $have_glibc, $libstdcxx"
echo "gpu_run: GPU: $gpu${driver_cuda:+, driver CUDA $driver_cuda${gpus:+, $gpus visible}}"
echo "gpu_run: CUDA libraries (as the loader resolves them):"
sed 's/^/gpu_run:   /' <<<"$cuda_resolved"
echo "gpu_run: NCCL $nccl_version"

# Each binary's libraries, and the bundled ones': inside the bundle or what a host provides.
outside() {
  for file in "$@"; do resolve "$file"; done |
    here=$here/ ok="^($host_provides)" awk '$2 == "not-found" || (index($2, ENVIRON["here"]) != 1 && $1 !~ ENVIRON["ok"]) {print $1 " -> " $2}' |
    sort -u | tr '\n' ' '
}
for bin in "${binaries[@]}" lib; do
  if [[ $bin == lib ]]; then wrong=$(outside "$here"/lib/*.so* "$here"/lib/cuda/*.so*); else wrong=$(outside "$root/$bin"); fi
  if [[ -z $wrong ]]; then record PASS "libraries $bin" ""; else record FAIL "libraries $bin" "$wrong"; fi
done

# What the tests expect from `bazel test`: the runfiles root as working directory, the
# runfiles variables, a private TEST_TMPDIR.
export TEST_SRCDIR=$here/runfiles RUNFILES_DIR=$here/runfiles TEST_WORKSPACE=dtr
cd "$root" || stop "no runfiles tree at $root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
name_of() { tr '/' '_' <<<"$1"; }

# A Catch2 listing's count: "N test cases" or "N matching test cases" (0 if none).
listed_cases() { grep -oE '^[0-9]+ (matching )?test cases?' | awk '{print $1}' | tail -1; }

if [[ $mode == rehearse ]]; then
  # ---- rehearsal: what runs without a GPU -------------------------------------------------
  for bin in "${binaries[@]}"; do
    absent=()
    while read -r entry _; do [[ -e $here/runfiles/$entry ]] || absent+=("$entry"); done <"$root/$bin.runfiles_manifest"
    if ((${#absent[@]} == 0)); then record PASS "runfiles $bin" ""; else record FAIL "runfiles $bin" "absent: ${absent[*]}"; fi
  done
  for bin in "${binaries[@]}"; do
    log=$logs/bind_now_$(name_of "$bin").log
    if [[ $bin == tests/* ]]; then
      env -i LD_LIBRARY_PATH="$LD_LIBRARY_PATH" LD_BIND_NOW=1 "./$bin" --list-tests >"$log" 2>&1
      cases=$(listed_cases <"$log")
      if ((${cases:-0} > 0)); then record PASS "loads $bin" "$cases cases"; else record FAIL "loads $bin" "$(tail -1 "$log")"; fi
    elif env -i LD_LIBRARY_PATH="$LD_LIBRARY_PATH" LD_BIND_NOW=1 "./$bin" --help >"$log" 2>&1; then
      record PASS "loads $bin" ""
    else
      record FAIL "loads $bin" "$(tail -1 "$log")"
    fi
  done
  log=$logs/train_cpu.log
  if env -i PATH=/usr/bin:/bin HOME="$tmp" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
    tools/launcher/dtrrun --nproc-per-node 2 tools/train/train --device cpu --dim 32 --layers 2 --heads 2 \
    --seq-len 16 --batch-size 4 --steps 3 --warmup 1 --log-every 1 --eval-every 0 --out "$tmp/train" >"$log" 2>&1 &&
    [[ $(grep -c . "$tmp/train/metrics.jsonl" 2>/dev/null) == 3 ]]; then
    record PASS "dtrrun + train --device cpu" "3 steps on 2 ranks"
  else
    record FAIL "dtrrun + train --device cpu" "$(tail -1 "$log")"
  fi
else
  # ---- 2. the gpu tests -------------------------------------------------------------------
  pool_end=$((SECONDS + test_pool))
  for bin in "${tests[@]}"; do
    log=$logs/$(name_of "$bin").log
    limit=$((pool_end - SECONDS))
    ((limit > test_limit)) && limit=$test_limit
    if ((limit < 5)); then
      record FAIL "$bin" "not run: the tests' $test_pool s were spent"
      continue
    fi
    filter=()
    if ((gpus < 2)); then
      filter=('~[multi_gpu]')
      multi=$("./$bin" --list-test-names-only '[multi_gpu]' 2>/dev/null | grep -c .)
      ((multi > 0)) && record SKIP "$bin [multi_gpu]" "$multi cases need two GPUs" "$multi"
    fi
    TEST_TMPDIR=$tmp/$(name_of "$bin")
    export TEST_TMPDIR
    mkdir -p "$TEST_TMPDIR"
    began=$SECONDS
    timeout -k 10 "$limit" "./$bin" "${filter[@]}" >"$log" 2>&1
    status=$?
    took=$((SECONDS - began))
    p="" f=0 s=0
    read -r p f s < <(python3 "$here/count_catch2.py" "$log")
    if ((status == 124 || status == 137)); then
      record FAIL "$bin" "TIMEOUT after ${limit} s (${p:-0} passed before; log $log)"
    elif [[ -z ${p:-} ]]; then
      record FAIL "$bin" "exit $status, no Catch2 summary (log $log)"
    else
      passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
      report+=("$(printf '%-4s %-46s %s' "$( ((f == 0)) && echo ok || echo FAIL)" "$bin" \
        "$p passed, $f failed, $s skipped in $took s")")
      echo "gpu_run: $bin: $p passed, $f failed, $s skipped in $took s"
      if ((f == 0 && status != 0)); then record FAIL "$bin" "exit $status after its cases (log $log)"; fi
    fi
    ((f > 0)) && grep -B2 -A12 -E 'FAILED:|failed:' "$log" | head -60
  done
  tests_end=$SECONDS

  # ---- 3. gpu_bench -----------------------------------------------------------------------
  if timeout -k 10 "$bench_limit" tools/bench/gpu_bench >"$logs/gpu_bench.log" 2>&1; then
    record PASS "gpu_bench" "tables below"
  else
    record FAIL "gpu_bench" "exit $? (WRONG rows, an error, or over $bench_limit s; log $logs/gpu_bench.log)"
  fi

  # ---- 4. the train row, 5. PyTorch's fully_shard on the same model -----------------------
  model=(--dim 2048 --layers 16 --heads 16 --seq-len 2048 --batch-size 8)
  if timeout -k 10 "$train_limit" tools/train/train --device cuda --parallel fsdp --arch gpt --mixed-precision \
    "${model[@]}" --steps 12 --warmup 2 --log-every 4 --eval-every 0 --out "$tmp/train" >"$logs/train.log" 2>&1; then
    record PASS "train --device cuda" "fsdp, bf16, ${model[*]}"
  else
    record FAIL "train --device cuda" "exit $? (log $logs/train.log)"
  fi
  torch=$(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)
  if [[ -z $torch ]]; then
    record SKIP "PyTorch fully_shard peer" "torch does not import here"
  elif timeout -k 10 "$peer_limit" python3 -m torch.distributed.run --standalone --nproc_per_node 1 \
    tools/bench/peers/train_gpu_peer.py "${model[@]}" --vocab 256 --steps 10 --warmup 2 >"$logs/peer.log" 2>&1 &&
    grep -q '^torch fsdp_gpu ' "$logs/peer.log"; then
    record PASS "PyTorch fully_shard peer" "torch $torch"
  else
    record FAIL "PyTorch fully_shard peer" "torch $torch; exit or no figures (log $logs/peer.log)"
  fi
fi

# ---- summary ----------------------------------------------------------------------------
echo
echo "gpu_run summary ($mode, bundle $commit, $((SECONDS - start)) s)"
echo "  GPU: $gpu${driver_cuda:+, driver CUDA $driver_cuda}; NCCL $nccl_version"
printf '  %s\n' "${report[@]}"
if [[ $mode == run ]]; then
  echo "  times: preflight and tests $tests_end s, then benchmarks and train"
  [[ -s $logs/gpu_bench.log ]] && sed 's/^/  /' "$logs/gpu_bench.log"
  echo "  train --device cuda --parallel fsdp --arch gpt --mixed-precision ${model[*]}:"
  if grep -qE '^step ' "$logs/train.log"; then
    grep -E '^(device|mfu|model|step) ' "$logs/train.log" | sed 's/^/    /'
    sed -n '/^rank /,/^$/p' "$logs/train.log" | sed 's/^/    /'
  else
    tail -5 "$logs/train.log" | sed 's/^/    /'
  fi
  [[ -n $torch ]] && echo "  PyTorch $torch: $(grep -E '^torch' "$logs/peer.log" | tail -1)"
fi
((skipped > 0)) && echo "skipped: $skipped"
echo "$passed passed, $failed failed"
((failed == 0))
