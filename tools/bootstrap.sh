#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages), then configures and builds the ladder in
# ./build. CUDA rungs are built when nvcc is found (on PATH or in /usr/local/cuda/bin);
# without it the CPU rungs build, test and run on their own.
#   tools/bootstrap.sh            # install + configure + build
#   BUILD_DIR=out tools/bootstrap.sh
#   LADDER_CMAKE_ARGS="-DLADDER_WERROR=ON" tools/bootstrap.sh   # extra CMake options (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
pkgs=(g++ cmake ninja-build libeigen3-dev catch2 libcli11-dev python3 python3-numpy python3-matplotlib)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "bootstrap: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# shellcheck disable=SC2086
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LADDER_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "bootstrap: built in $build ($(command -v nvcc >/dev/null && echo 'with CUDA rungs' || echo 'CPU rungs only: no CUDA toolkit'))"
