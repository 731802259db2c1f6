#!/usr/bin/env bash
# fault.NN: the harness run on GPU rung NN built with its planted defect (LADDER_FAULT,
# common/fault.hpp) must fail: at least one shared case FAILs with a wrong result. Passes
# (exit 0) when the harness caught the defect, printing how many runs caught it; exit 77
# (skipped) without a CUDA device.
#   fault.sh BUILD_DIR NN
set -u
build=$1 nn=$2
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "NOT RUN: fault.$nn needs a CUDA device"
  exit 77
fi
cmake --build "$build" --target "harness_fault_$nn" >/dev/null ||
  { echo "FAILED: building harness_fault_$nn"; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$build/tests/harness_fault_$nn" --step "$nn" >"$log" 2>&1
rc=$?
caught=$(grep -c '^  FAIL ' "$log")
passed=$(grep -c '^  pass ' "$log")
grep -m 3 -A 1 '^  FAIL ' "$log"
echo "fault.$nn: the defect was caught by $caught runs ($passed runs passed; harness exit $rc)"
if [ "$rc" -ne 0 ] && [ "$caught" -gt 0 ]; then
  exit 0
fi
echo "FAILED: the harness did not catch step $nn's planted defect"
exit 1
