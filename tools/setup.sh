#!/usr/bin/env bash
# Installs what dtr needs on a Debian 12 machine, once: Bazel 4.2.3 and the libraries
# it builds against. Quiet when everything is already there. The CUDA toolkit is not a
# Debian package: it is taken from $CUDA_HOME (default /usr/local/cuda). Arguments name
# more Debian packages that one tool needs (tools/gpu_bundle.sh: qemu-user).
set -euo pipefail

packages=(bazel-bootstrap bazel-platforms bazel-rules-java libeigen3-dev catch2 libgloo-dev libfmt-dev libcli11-dev nlohmann-json3-dev g++ clang-format-14 "$@")
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "dtr setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}" >&2
fi
cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ ! -x $cuda_home/bin/nvcc ]]; then
  echo "dtr setup: no nvcc under $cuda_home; install the CUDA toolkit or set CUDA_HOME" >&2
  exit 1
fi
