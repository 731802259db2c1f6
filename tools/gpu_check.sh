#!/usr/bin/env bash
# One call on the GPU machine: build, test (gpu + sanitizer labels), benchmark the ladder's
# GPU rungs and PyTorch's SDPA peers side by side, and leave logs and CSVs in $OUT.
#   tools/gpu_check.sh [test] [sanitize] [bench] [peers]      (default: all four)
# Environment: BENCH_ARGS (extra `ladder bench` flags), PEER_ARGS (extra peers.py flags),
# CTEST_ARGS (e.g. "-R 05"), OUT (output folder, default ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
what=${*:-test sanitize bench peers}
status=0
log() { echo "== $*" | tee -a "$OUT/summary.log"; }
# At most 8 files come back from $OUT: summary.log, build.log, ctest-gpu.log,
# ctest-sanitizer.log, bench.log, peers.log, h100.csv (the peers' rows appended to it).
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee -a "$OUT/summary.log"
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH="$PWD/.deps" -DCMAKE_BUILD_TYPE=Release &&
  cmake --build build-gpu -j 16; } >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
log "built ${LADDER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
for w in $what; do
  case $w in
    test)
      ctest --test-dir build-gpu -L gpu --output-on-failure ${CTEST_ARGS:-} -j 1 >"$OUT/ctest-gpu.log" 2>&1 || status=1
      log "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log" || echo see log)"
      grep -E '^\s*(FAIL|NOT RUN)' "$OUT/ctest-gpu.log" | head -40 | tee -a "$OUT/summary.log"
      ;;
    sanitize)
      ctest --test-dir build-gpu -L sanitizer -V ${CTEST_ARGS:-} -j 4 >"$OUT/ctest-sanitizer.log" 2>&1 || status=1
      log "ctest -L sanitizer: $(grep -E 'tests passed|tests failed' "$OUT/ctest-sanitizer.log" || echo see log)"
      grep -E 'Failed|ERROR SUMMARY: [1-9]' "$OUT/ctest-sanitizer.log" | head -20 | tee -a "$OUT/summary.log"
      ;;
    bench)
      build-gpu/ladder bench --csv "$OUT/h100.csv" ${BENCH_ARGS:---preset flash} >"$OUT/bench.log" 2>&1 || status=1
      log "bench: $(wc -l <"$OUT/h100.csv") rows"; tail -n 40 "$OUT/bench.log"
      ;;
    peers)
      # peers.py leaves the commit column '-'; stamp its rows with this call's commit, which
      # is how tools/figures.py pairs a rung with the peers measured side by side with it.
      rm -f "$OUT/peers.csv"
      PYTHONUNBUFFERED=1 python3 .deps/bin/peers.py --csv "$OUT/peers.csv" ${PEER_ARGS:-} >"$OUT/peers.log" 2>&1 || status=1
      if [ -s "$OUT/peers.csv" ]; then
        [ -s "$OUT/h100.csv" ] || head -n 1 "$OUT/peers.csv" >"$OUT/h100.csv"
        commit=${LADDER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)}
        tail -n +2 "$OUT/peers.csv" | sed "s/,-\$/,$commit/" >>"$OUT/h100.csv"
        rm -f "$OUT/peers.csv"
      fi
      log "peers: done"; tail -n 30 "$OUT/peers.log"
      ;;
  esac
done
cat "$OUT/summary.log"
exit $status
