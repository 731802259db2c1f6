#!/usr/bin/env bash
# CI for the PyTorch package (python/): on a fresh Debian 12 machine without a GPU, install a
# pinned PyTorch into a virtual environment, `pip install ./python` (the CPU library, rung 0:
# no CUDA library is built, LADDER_TORCH_CUDA=0), and run its pytest: the CPU tests (opcheck,
# gradcheck, torch.compile, the float64 training parity, the GPT smoke run) run, the GPU tests
# say they were skipped. Exit status: pytest's, except that "no tests ran" (5) is a failure too.
#
# PyPI's only Linux x86_64 torch wheel is the CUDA build, whose nvidia-* dependencies it needs
# even to import (libtorch_cuda.so links cuBLAS, cuDNN, NCCL, ...): about 4.7 GB installed. On a
# 2-core machine shared with other builds, from nothing (no pip cache): torch 163 s, the package
# 137 s, pytest 102 s; 6 min 55 s in all. The venv is kept in $LADDER_PY_VENV (default .venv-ci,
# ignored by git) and reused when it already has the pinned torch.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${LADDER_TORCH_VERSION:-2.11.0}"
VENV="${LADDER_PY_VENV:-.venv-ci}"
ROOT="$PWD"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

need=()
command -v g++ >/dev/null 2>&1 || need+=(g++)
[ -f /usr/include/eigen3/Eigen/Dense ] || [ -n "${LADDER_EIGEN_INCLUDE:-}" ] || need+=(libeigen3-dev)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  echo "== apt-get install ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "== pip install torch==$TORCH_VERSION (PyPI)"
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH_VERSION" pytest ninja numpy
fi
echo "== torch ready ($(($(date +%s) - start)) s)"

echo "== pip install ./python (CPU library)"
start=$(date +%s)
LADDER_TORCH_CUDA=0 MAX_JOBS="${MAX_JOBS:-2}" "$VENV/bin/pip" install -q --disable-pip-version-check ./python
echo "== installed ($(($(date +%s) - start)) s)"
(cd /tmp && "$VENV/bin/python" -c "import ladder_torch; print('\n'.join(ladder_torch.available_rungs()))")

echo "== pytest python/tests"
status=0
# From /tmp, so that nothing but the installed package can be imported as ladder_torch.
(cd /tmp && "$VENV/bin/python" -m pytest -p no:cacheprovider -rs -q "$ROOT/python/tests") || status=$?
if [ "$status" = 5 ]; then
  echo "ci_python: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
