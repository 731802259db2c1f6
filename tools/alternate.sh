#!/usr/bin/env bash
# Rung and peer measured in alternating processes, rung, peer, rung, peer ..., so that each
# bar point can be the median over several processes of both (a peer's rate moves between
# processes: cuDNN's by up to 2.7x at short sequences on the H100). Pass i writes the rung's and
# the peer's rows with one run id, <base>.i, so a ratio pairs rows of the same alternation;
# tools/bar_table.py turns the file into per-point medians of those ratios.
#   tools/alternate.sh CSV PASSES "LADDER_BENCH_FLAGS" "PEERS_FLAGS"
# e.g. tools/alternate.sh out/h200.csv 3 \
#        "--preset flash --steps 7 --dtype bf16,fp16 --seqlens 256,512,1024 --causal 0,1" \
#        "--backends cudnn --dtypes bf16 fp16 --dims 64 128 --seqlens 256 512 1024 --causal 0 1"
# Environment: LADDER (default build-gpu/ladder), LADDER_COMMIT (passed on to both), OUT (logs).
set -uo pipefail
cd "$(dirname "$0")/.."
csv=$1 passes=$2 bench_flags=$3 peer_flags=$4
ladder=${LADDER:-build-gpu/ladder}
log=${OUT:-out}/alternate.log
mkdir -p "$(dirname "$csv")" "$(dirname "$log")"
base=alt-$(date -u +%Y%m%dT%H%M%SZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
commit=${LADDER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
status=0
for i in $(seq 1 "$passes"); do
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$ladder" bench --csv "$csv" --run-id "$base.$i" $bench_flags >>"$log" 2>&1 || status=1
  t1=$(date +%s)
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 python3 tools/peers.py --csv "$csv" --commit "$commit" \
    --run-id "$base.$i" $peer_flags >>"$log" 2>&1 || status=1
  echo "alternation $i ($base.$i): rung $((t1 - t0)) s, peer $(($(date +%s) - t1)) s" | tee -a "$log"
done
echo "runs $base.1 .. $base.$passes in $csv (exit $status)"
exit $status
