#!/usr/bin/env bash
# fault.NN: the harness run on GPU rung NN built with its planted defect (LADDER_FAULT,
# common/fault.hpp) must fail: at least one shared case FAILs with a wrong result. Passes
# (exit 0) when the harness caught the defect, printing how many runs caught it; exit 77
# (skipped) without a CUDA device.
# fault.rescale.NN (KIND rescale): the rung built with the old online-softmax rescale
# (LADDER_FAULT_RESCALE), run on the cases at scale only; the log keeps every verdict line,
# so each case's LSE error against its tolerance can be read before and after.
#   fault.sh BUILD_DIR NN [rescale]
set -u
build=$1 nn=$2 kind=${3:-}
target=harness_fault_$nn name=fault.$nn args=()
if [ "$kind" = rescale ]; then
  target=harness_fault_rescale_$nn name=fault.rescale.$nn args=(--at-scale-only)
elif [ -n "$kind" ]; then
  echo "usage: fault.sh BUILD_DIR NN [rescale]" >&2
  exit 2
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "NOT RUN: $name needs a CUDA device"
  exit 77
fi
cmake --build "$build" --target "$target" >/dev/null ||
  { echo "FAILED: building $target"; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$build/tests/$target" --step "$nn" "${args[@]}" >"$log" 2>&1
rc=$?
[ "$kind" = rescale ] && grep -E '^  (pass|FAIL) ' "$log"
caught=$(grep -c '^  FAIL ' "$log")
passed=$(grep -c '^  pass ' "$log")
grep -m 3 -A 1 '^  FAIL ' "$log"
echo "$name: the defect was caught by $caught runs ($passed runs passed; harness exit $rc)"
if [ "$rc" -ne 0 ] && [ "$caught" -gt 0 ]; then
  exit 0
fi
echo "FAILED: the harness did not catch step $nn's planted defect ($name)"
exit 1
