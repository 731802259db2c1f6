#!/usr/bin/env bash
# fault.07: step 07's forward built with a wait removed (LADDER_07_FAULT=skip_k_wait: the
# consumers issue S = Q K_j^T before K_j's copy has landed) must fail its self-test's checks on
# a shape whose K/V ring wraps many times: `07_fault --expect-fault` exits 0 only if every
# variant's check caught the fault. Exit 77 (skipped) without an sm_90 GPU.
#   fault07.sh BUILD_DIR
set -u
build=$1
if ! nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -q '^9\.0'; then
  echo "NOT RUN: fault.07 needs an sm_90 GPU (H100/H200)"
  exit 77
fi
cmake --build "$build" --target 07_fault >/dev/null || { echo "FAILED: building 07_fault"; exit 1; }
"$build/tests/07_fault" --expect-fault
