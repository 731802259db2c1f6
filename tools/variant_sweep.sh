#!/usr/bin/env bash
# The variant and tile sweeps behind the notes' tables (run on the GPU machine):
#   tools/variant_sweep.sh BUILD_DIR
# Step 05: Br (--tile-q) at seq 4096, and the FA1 vs FA2 loop order. Step 06: every variant
# (each technique switched off in turn). Flash-attention shapes: batch*seq = 16384, heads*d = 2048.
# Every run is checked against the oracle (sampled rows) before its time is printed.
set -uo pipefail
bin=${1:-build}/steps
run() {  # prints "label  ms  TFLOP/s" or the failure
  local label=$1; shift
  local out
  out=$("$@" --check sampled 2>&1)
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "$label  FAILED(rc=$rc): $(echo "$out" | grep -E 'FAIL|error' | head -1)"
  else
    echo "$label  $(echo "$out" | awk '/forward/ {print $2" ms  "$4" TFLOP/s"}')  $(echo "$out" | awk '/backward/ {print "bwd "$2" ms  "$4" TFLOP/s"}')"
  fi
}
shape() { echo "--batch 4 --heads $((2048 / $1)) --seq-q 4096 --seq-k 4096 --dim $1"; }
echo "## step 05: Br sweep (Bc = 64), seq 4096, non-causal, fp32"
for d in 64 128; do
  for br in 16 32 48 64 96 128; do
    # shellcheck disable=SC2046
    run "05 d=$d Br=$br" "$bin/05_shared_memory_fa2" $(shape $d) --tile-q $br
  done
done
echo "## step 05: loop order, seq 4096, fp32"
for d in 64 128; do
  for c in "" --causal; do
    for v in fa2 fa1; do
      # shellcheck disable=SC2046
      run "05 d=$d ${c:-non-causal} $v" "$bin/05_shared_memory_fa2" $(shape $d) $c --variant $v
    done
  done
done
echo "## step 06: variants, seq 4096, bf16"
for d in 64 128; do
  for c in "" --causal; do
    for v in full no-swizzle no-cp-async no-ldmatrix p-via-smem direct-store baseline; do
      # shellcheck disable=SC2046
      run "06 d=$d ${c:-non-causal} $v" "$bin/06_tensor_core_fa2" $(shape $d) $c --variant $v
    done
  done
done
