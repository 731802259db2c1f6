#!/usr/bin/env bash
# sanitize.sh TOOL STEP_BINARY [bulk-copy-war]: runs compute-sanitizer (memcheck | racecheck | synccheck |
# initcheck) on a GPU step at small odd shapes (causal, GQA, seq_q != seq_k, the backward pass
# where the step has one, dropout and a block mask where it has them). Passes only with zero
# errors. What the tools cannot see: racecheck tracks shared-memory hazards between ordinary
# loads and stores, not the writes of the TMA engine (the async proxy) nor wgmma's reads, and
# synccheck checks barrier use, not mbarrier phases; step 07's missing-wait test (a build with
# a wait removed, which its self-test must catch) covers what they miss.
# bulk-copy-war (step 07, racecheck only): racecheck charges a 1-D bulk copy's shared-memory
# writes (cp.async.bulk, hopper::bulk_load) to the thread that issued it and does not see the
# stage's empty mbarrier that orders them after the consumers' reads, so it reports a WAR hazard
# for every L/D word a stage reuses. Such a run passes only if every hazard is displayed
# (--print-limit 0) and every one is exactly that: a WAR whose write is bulk_load's. Any other
# hazard, or one it cannot classify, fails.
# LADDER_SANITIZE_VARIANTS=all (the exercise grade sets it) adds every variant the step's --help
# lists, each at the first shape: a learner's region may sit in a variant the default runs
# without (step 05's 'row' kernel stages K and V in shared memory behind its own barriers).
# Exit 77 (ctest: skipped, with the reason printed) when there is no sanitizer or device.
set -u
tool=$1
bin=$2
allow=${3:-}
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
[ "$tool" = racecheck ] && [ "$allow" = bulk-copy-war ] && san_opts+=(--print-limit 0)
shapes=("--seq-q 37 --seq-k 53 --heads 2 --heads-kv 1 --dim 64 --causal"
        "--seq-q 70 --seq-k 33 --heads 1 --dim 128 --causal"
        "--seq-q 45 --seq-k 45 --heads 1 --dim 64")
# Dropout and block masks where the step has them: a kept and a skipped block, a ring of tiles.
if "$bin" --help | grep -q 'dropout, block-sparse'; then
  shapes+=("--seq-q 300 --seq-k 420 --heads 2 --heads-kv 1 --dim 64 --causal --dropout 0.2 --block-sparsity random:0.6")
fi
# Step 07's cp.async variant: the one whose shared-memory copies are ordinary stores (cp.async),
# which racecheck does see, ordered by wait_group and block barriers.
if "$bin" --help | grep -q '^  wgmma: '; then
  shapes+=("--seq-q 300 --seq-k 420 --heads 2 --heads-kv 1 --dim 128 --causal --variant wgmma")
fi
if [ "${LADDER_SANITIZE_VARIANTS:-}" = all ]; then
  while read -r v; do
    shapes+=("${shapes[0]} --variant $v")
  done < <("$bin" --help | sed -n '/^Variants (--variant):/,/^[^ ]/s/^  \([^ :(]*\)[ :(].*/\1/p')
fi
status=0
for shape in "${shapes[@]}"; do
  echo "+ compute-sanitizer ${san_opts[*]} $bin $shape ${extra[*]} ${args[*]}"
  log=$(mktemp)
  # shellcheck disable=SC2086
  "$san" "${san_opts[@]}" "$bin" $shape "${extra[@]}" "${args[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ $rc -eq 99 ] && [ "$tool" = racecheck ] && [ "$allow" = bulk-copy-war ]; then
    # Classify the errors the summary counts: each hazard ("Potential WAR hazard", then its
    # Read and Write lines) and each race report that --racecheck-report all adds per pair of
    # instructions ("Race reported between Write access at ... and Read access at ..."). A
    # hazard is accepted if it is a WAR whose write line names hopper::bulk_load; a race report
    # if its write is bulk_load's (its reads are listed after it).
    read -r shown errors ok < <(awk '
      /Potential [A-Z]+ hazard detected/ { n++; war = ($0 ~ /Potential WAR hazard/) }
      /Write Thread/ && war && /hopper::bulk_load/ { k++; war = 0 }
      /Race reported between/ { n++; if ($0 ~ /between Write access at ladder::hopper::bulk_load/) k++ }
      /RACECHECK SUMMARY/ { for (i = 1; i <= NF; i++) if ($i ~ /^\(/) e = substr($i, 2) }
      END { print n + 0, e + 0, k + 0 }' "$log")
    if [ "$shown" -gt 0 ] && [ "$shown" = "$errors" ] && [ "$ok" = "$shown" ]; then
      echo "racecheck: all $errors errors (hazards and race reports) are WAR between a read and a 1-D bulk copy's write, which the stage's mbarrier orders and racecheck cannot see: accepted (bulk-copy-war)"
      rc=0
    else
      echo "racecheck: $shown errors displayed (hazards and race reports) of $errors, $ok of them bulk-copy WAR: not accepted"
    fi
  fi
  rm -f "$log"
  if [ $rc -eq 2 ]; then
    echo "(shape not supported by this step: skipped)"
  elif [ $rc -ne 0 ]; then
    echo "FAILED ($rc)"
    status=1
  fi
done
exit $status
