#!/usr/bin/env bash
# exercise.racecheck (gpu): a learner's answer to step 05's smem-staging region that copies the
# tile correctly but leaves out its two __syncthreads() (the slip seed 001 makes) must FAIL the
# GPU grade, with compute-sanitizer's racecheck among the reasons: a missing barrier can give
# right numbers on one GPU run and wrong ones on the next, so the grade cannot rest on the
# harness's results alone.
#   test_race.sh SOURCE_DIR SCRATCH_DIR
# Exit 77 (skipped) without a CUDA device or compute-sanitizer.
set -uo pipefail
src=$1
scratch=$2
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "NOT RUN: exercise.racecheck needs a CUDA device"
  exit 77
fi
if ! command -v compute-sanitizer >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/compute-sanitizer ]; then
  echo "NOT RUN: exercise.racecheck needs compute-sanitizer"
  exit 77
fi
ex=$scratch/ex
step=05_shared_memory_fa2
rm -rf "$ex"
mkdir -p "$scratch"
python3 "$src/tools/exercise.py" create 5 --dir "$ex" --region smem-staging >"$scratch/create.log" 2>&1 ||
  { cat "$scratch/create.log"; echo "FAIL: create"; exit 1; }
# The solution, less the region's two barriers.
copy=$ex/$step/row_per_thread.cuh
awk '/EXERCISE BEGIN smem-staging/ { inside = 1 } /EXERCISE END/ { inside = 0 }
     !(inside && /__syncthreads\(\);/) { print }' "$src/steps/$step/row_per_thread.cuh" >"$copy"
if [ "$(grep -c '__syncthreads' "$copy")" -ge "$(grep -c '__syncthreads' "$src/steps/$step/row_per_thread.cuh")" ]; then
  echo "FAIL: the barrier-less answer still has its barriers"
  exit 1
fi
python3 "$src/tools/exercise.py" grade 5 --dir "$ex" --build "$scratch/build" >"$scratch/grade.log" 2>&1
rc=$?
tail -n 25 "$scratch/grade.log"
if [ $rc -ne 1 ]; then
  echo "FAIL: the grade of a barrier-less smem-staging answer exited $rc, not 1 (FAIL)"
  exit 1
fi
if ! grep -q 'sanitizer racecheck: FAIL' "$scratch/grade.log"; then
  echo "FAIL: the grade failed, but racecheck did not report the missing barriers"
  exit 1
fi
echo "exercise.racecheck: the barrier-less answer FAILs the grade, racecheck named"
