#!/usr/bin/env bash
# sanitize.sh TOOL STEP_BINARY: runs compute-sanitizer (memcheck | racecheck | synccheck |
# initcheck) on a GPU step at small odd shapes (causal, GQA, seq_q != seq_k, the backward pass
# where the step has one, dropout and a block mask where it has them). Passes only with zero
# errors. What the tools cannot see: racecheck tracks shared-memory hazards between ordinary
# loads and stores, not the writes of the TMA engine (the async proxy) nor wgmma's reads, and
# synccheck checks barrier use, not mbarrier phases; step 07's missing-wait test (a build with
# a wait removed, which its self-test must catch) covers what they miss.
# Exit 77 (ctest: skipped, with the reason printed) when there is no sanitizer or device.
set -u
tool=$1
bin=$2
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$san" ]; then
  echo "NOT RUN: compute-sanitizer not found"
  exit 77
fi
"$bin" --seq-q 1 --seq-k 1 --heads 1 --dim 64 --repeats 1 --warmup 0 --check none >/dev/null 2>&1
rc=$?
if [ $rc -eq 3 ]; then
  echo "NOT RUN: no CUDA device for $bin"
  exit 77
fi
extra=()
if "$bin" --help | grep -q 'fwd+bwd'; then extra+=(--backward); fi
args=(--repeats 1 --warmup 0 --check none)
san_opts=(--tool "$tool" --error-exitcode 99)
[ "$tool" = racecheck ] && san_opts+=(--racecheck-report all)
shapes=("--seq-q 37 --seq-k 53 --heads 2 --heads-kv 1 --dim 64 --causal"
        "--seq-q 70 --seq-k 33 --heads 1 --dim 128 --causal"
        "--seq-q 45 --seq-k 45 --heads 1 --dim 64")
# Dropout and block masks where the step has them: a kept and a skipped block, a ring of tiles.
if "$bin" --help | grep -q 'dropout, block-sparse'; then
  shapes+=("--seq-q 300 --seq-k 420 --heads 2 --heads-kv 1 --dim 64 --causal --dropout 0.2 --block-sparsity random:0.6")
fi
status=0
for shape in "${shapes[@]}"; do
  echo "+ compute-sanitizer ${san_opts[*]} $bin $shape ${extra[*]} ${args[*]}"
  # shellcheck disable=SC2086
  "$san" "${san_opts[@]}" "$bin" $shape "${extra[@]}" "${args[@]}"
  rc=$?
  if [ $rc -eq 2 ]; then
    echo "(shape not supported by this step: skipped)"
  elif [ $rc -ne 0 ]; then
    echo "FAILED ($rc)"
    status=1
  fi
done
exit $status
