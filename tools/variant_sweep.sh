#!/usr/bin/env bash
# The sweeps behind the notes' tables (run on the GPU machine):
#   tools/variant_sweep.sh BUILD_DIR
# Step 05's Br (--tile-q) at seq 4096, then every variant of steps 05-07 as their descriptors
# list them (ladder bench --variants all: 05's FA1 loop order, 06's path up and ablations, 07's
# ladder), causal 0 and 1. Flash-attention shapes: batch*seq = 16384, heads*d = 2048. Every run
# is checked against the oracle (sampled rows) before its time is printed.
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
echo "## steps 05-07: every variant, seq 4096 (ladder bench --variants all)"
"${1:-build}/ladder" bench --preset flash --steps 5,6,7 --variants all --seqlens 4096 \
  --causal 0,1 --directions fwd
