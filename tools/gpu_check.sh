#!/usr/bin/env bash
# One call on a GPU machine: build, test, sanitize, benchmark the ladder's GPU rungs and the
# PyTorch peers side by side, and leave logs and CSVs in $OUT. Needs the header-only
# dependencies staged where the machine cannot install packages (tools/stage-deps.sh .deps).
#   tools/gpu_check.sh [STAGE...]     (default: build test sanitize ceilings bench peers)
# Stages:
#   build      configure and build build-gpu/ (warnings as errors), always first
#   test       ctest -L gpu (the harness on every GPU rung, every shared case)
#   sanitize   ctest -L sanitizer (compute-sanitizer: memcheck, racecheck, synccheck, initcheck)
#   harness    the harness alone on every GPU rung, every per-run line -> $OUT/harness.log (for
#              tools/harness_table.py: each rung's margin under the rule)
#   faults     ctest -R "$FAULT_TESTS" (default '^fault\.': the planted defects, fault.rescale.NN
#              too) -> $OUT/faults.log
#   drift      tools/lse_drift.sh: LSE error against seq, rungs 06 and 07 as built and with the
#              rescale fault -> $OUT/lse-drift.csv
#   selftest   rung 07's self-tests, forward and backward (tests/rung07; no timings)
#   trace      step 07's per-warp timeline -> $OUT/<gpu>-trace-07.csv
#   ceilings   the measured ceilings -> $OUT/ceilings.csv
#   bench      ladder bench $BENCH_ARGS (default --preset flash) -> $OUT/<gpu>.csv
#   peers      tools/peers.py $PEER_ARGS, rows appended to the same $OUT/<gpu>.csv
#   alternate  tools/alternate.sh: rung and peer in $ALT_PASSES (default 3) alternating processes,
#              $ALT_BENCH and $ALT_PEERS their flags, rows to $OUT/<gpu>.csv with one run id per
#              alternation (tools/bar_table.py: per-point medians of the ratios)
# Every row this call writes (bench and peers) carries one run id, fresh per invocation, in the
# results' run column: tools/figures.py pairs a rung with the peers of its own run, so run bench
# and peers in one call to compare them.
#   python     build the PyTorch extension (python/build_ext.py), then pytest python/tests
#   gpt        the small GPT once per attention (sdpa rung6 rung7), 300 steps -> $OUT/gpt/
# Environment: OUT (default out/ in the repository; a relative OUT is taken from the calling
# folder), BENCH_ARGS, PEER_ARGS, CTEST_ARGS (e.g. "-R 07"), BUILD_TARGETS (targets the build
# stage makes beside all, in the same ninja run: e.g. the on-demand fault builds, so that later
# stages only link), BUILD_ALL (default 1; empty: only BUILD_TARGETS), HARNESS_REGEX (default
# '^harness\.'),
# LADDER_COMMIT (the commit the rows are stamped with; default: as the driver finds it, `git
# rev-parse --short HEAD` with -dirty when tracked files have uncommitted changes, else
# "unknown"), GPU_TAG (the results file's name; default from the GPU's name: h100, h200, else
# gpu).
set -uo pipefail
# A relative OUT is the caller's, taken from the folder the script is called from (it then works
# in the repository's root); unset, OUT is out/ in the repository.
if [ -n "${OUT:-}" ]; then
  case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
if [ -z "${GPU_TAG:-}" ]; then
  case $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) in
    *H100*) GPU_TAG=h100 ;;
    *H200*) GPU_TAG=h200 ;;
    *) GPU_TAG=gpu ;;
  esac
fi
mkdir -p "$OUT"
stages=${*:-build test sanitize ceilings bench peers}
BUILD_ALL=${BUILD_ALL-1}
# The commit by the driver's rule (tools/ladder.cpp, source_commit), found once so that the
# ceilings, the sweep and the peers of this call carry the same string.
if [ -z "${LADDER_COMMIT:-}" ]; then
  if LADDER_COMMIT=$(git rev-parse --short HEAD 2>/dev/null); then
    [ -z "$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" ] ||
      LADDER_COMMIT=$LADDER_COMMIT-dirty
  else
    LADDER_COMMIT=unknown
  fi
fi
export LADDER_COMMIT
commit=$LADDER_COMMIT
run_id=$(date -u +%Y%m%dT%H%M%SZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
status=0
log() { echo "== $*" | tee -a "$OUT/summary.log"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader |
  tee -a "$OUT/summary.log"
log "commit $commit; run $run_id; stages: $stages"
for stage in $stages; do
  t0=$(date +%s)
  case $stage in
    build)
      { cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH="$PWD/.deps" \
          -DCMAKE_BUILD_TYPE=Release -DLADDER_WERROR=ON &&
          cmake --build build-gpu -j "$(nproc)" --target ${BUILD_ALL:+all} ${BUILD_TARGETS:-}; } \
        >"$OUT/build.log" 2>&1 ||
        { tail -40 "$OUT/build.log"; log "build FAILED"; exit 1; }
      grep -E "C75[0-9][0-9]|spill" "$OUT/build.log" | head -5 | tee -a "$OUT/summary.log"
      ;;
    test)
      # shellcheck disable=SC2086
      ctest --test-dir build-gpu -L gpu --output-on-failure ${CTEST_ARGS:-} -j 1 \
        >"$OUT/ctest-gpu.log" 2>&1 || status=1
      log "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log" || echo see log)"
      grep -E '^\s*(FAIL|NOT RUN)|FAILED' "$OUT/ctest-gpu.log" | head -20 | tee -a "$OUT/summary.log"
      ;;
    sanitize)
      # shellcheck disable=SC2086
      ctest --test-dir build-gpu -L sanitizer -V ${CTEST_ARGS:-} -j 4 \
        >"$OUT/ctest-sanitizer.log" 2>&1 || status=1
      log "ctest -L sanitizer: $(grep -E 'tests passed|tests failed' "$OUT/ctest-sanitizer.log" || echo see log)"
      grep -E 'Failed|ERROR SUMMARY: [1-9]|hazards displayed \([1-9]' "$OUT/ctest-sanitizer.log" |
        head -10 | tee -a "$OUT/summary.log"
      ;;
    harness)
      ctest --test-dir build-gpu -L gpu -R "${HARNESS_REGEX:-^harness\.}" -V -j 1 \
        --timeout "${HARNESS_TIMEOUT:-900}" \
        >"$OUT/harness.log" 2>&1 || status=1
      log "harness: $(grep -E 'tests passed|tests failed' "$OUT/harness.log" || echo see log)"
      grep -E '^[0-9]+: step .*: [0-9]+ pass|^[0-9]+:   FAIL ' "$OUT/harness.log" | head -20 |
        tee -a "$OUT/summary.log"
      ;;
    faults)
      ctest --test-dir build-gpu -R "${FAULT_TESTS:-^fault\.}" -V -j 1 >"$OUT/faults.log" 2>&1 ||
        status=1
      log "faults: $(grep -E 'tests passed|tests failed' "$OUT/faults.log" || echo see log)"
      grep -E 'the defect was caught|FAILED' "$OUT/faults.log" | tee -a "$OUT/summary.log"
      ;;
    drift)
      tools/lse_drift.sh build-gpu "$OUT/lse-drift.csv" >"$OUT/lse-drift.log" 2>&1 || status=1
      log "drift: $(grep -c , "$OUT/lse-drift.csv" 2>/dev/null || echo 0) rows"
      ;;
    selftest)
      build-gpu/tests/07_selftest >"$OUT/selftest-07.log" 2>&1 || status=1
      build-gpu/tests/07_selftest_backward >>"$OUT/selftest-07.log" 2>&1 || status=1
      log "07 selftest: $(grep -cE '^PASS' "$OUT/selftest-07.log") PASS, $(grep -cE '^FAIL|TIMEOUT' "$OUT/selftest-07.log") FAIL"
      grep -E '^FAIL|TIMEOUT' "$OUT/selftest-07.log" | head -20 | tee -a "$OUT/summary.log"
      ;;
    trace)
      build-gpu/tests/07_selftest --trace "$OUT/$GPU_TAG-trace-07.csv" \
        >>"$OUT/selftest-07.log" 2>&1 || status=1
      log "07 trace: $(wc -l <"$OUT/$GPU_TAG-trace-07.csv" 2>/dev/null || echo 0) rows"
      ;;
    ceilings)
      build-gpu/ceilings --csv "$OUT/ceilings.csv" --commit "$commit" || status=1
      ;;
    bench)
      # shellcheck disable=SC2086
      build-gpu/ladder bench --csv "$OUT/$GPU_TAG.csv" --run-id "$run_id" ${BENCH_ARGS:---preset flash} \
        >"$OUT/bench.log" 2>&1 || status=1
      log "bench: $(grep -E 'points measured' "$OUT/bench.log")"
      grep -E '^FAIL|skipped:' "$OUT/bench.log" | head -10 | tee -a "$OUT/summary.log"
      ;;
    peers)
      # shellcheck disable=SC2086
      PYTHONUNBUFFERED=1 python3 tools/peers.py --csv "$OUT/$GPU_TAG.csv" --commit "$commit" \
        --run-id "$run_id" \
        ${PEER_ARGS:-} >"$OUT/peers.log" 2>&1 || status=1
      log "peers: $(tail -n 1 "$OUT/peers.log")"
      ;;
    alternate)
      LADDER=build-gpu/ladder OUT=$OUT tools/alternate.sh "$OUT/$GPU_TAG.csv" "${ALT_PASSES:-3}" \
        "${ALT_BENCH:---preset flash --steps 7}" "${ALT_PEERS:---backends cudnn}" || status=1
      log "alternate: $(tail -n 1 "$OUT/alternate.log")"
      ;;
    python)
      { python3 python/build_ext.py && python3 -m pytest -q -rs python/tests; } \
        >"$OUT/python.log" 2>&1 || status=1
      log "python: $(tail -n 1 "$OUT/python.log")"
      ;;
    gpt)
      { python3 python/train_gpt.py --attn sdpa rung6 rung7 --steps 300 --seed 0 \
          --out "$OUT/gpt" && python3 python/plot_gpt.py "$OUT/gpt"; } >"$OUT/gpt.log" 2>&1 ||
        status=1
      log "gpt: $(grep -E ' / sdpa|within|outside' "$OUT/gpt.log" | tr '\n' ' ')"
      ;;
    *)
      echo "unknown stage '$stage'"
      exit 2
      ;;
  esac
  log "$stage: $(($(date +%s) - t0)) s"
done
cat "$OUT/summary.log"
exit $status
