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
# CSV, and the relative paths in LADDER and OUT, are taken from the folder the script is called
# from (never from the repository's root, which it does not change to); PASSES is a whole number,
# 1 to 999999. CSV must be a new file or a regular file of the results schema (not a link, a FIFO
# or a device: both writers refuse those, so the script does before the first pass).
# Environment: LADDER (default <repository>/build-gpu/ladder), LADDER_COMMIT (passed on to both),
# OUT (the folder of alternate.log; default out, in the calling folder).
# Exit status: 0 every pass ran, 1 a pass failed (see the log), 2 bad arguments.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage() {
  echo "alternate.sh: error: $*" >&2
  echo "usage: tools/alternate.sh CSV PASSES \"LADDER_BENCH_FLAGS\" \"PEERS_FLAGS\"" >&2
  exit 2
}
[ $# -eq 4 ] || usage "4 arguments wanted, $# given"
csv=$1 passes=$2 bench_flags=$3 peer_flags=$4
if ! [[ $passes =~ ^[0-9]{1,6}$ ]] || [ "$((10#$passes))" -lt 1 ]; then
  usage "PASSES '$passes': a whole number of alternations, 1 to 999999"
fi
passes=$((10#$passes))
[ -n "$csv" ] || usage "CSV: an empty path names no file"
# Relative paths from the calling folder, made absolute before anything runs.
absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
csv=$(absolute "$csv")
if [ -L "$csv" ]; then
  usage "CSV $csv: is a symbolic link; give the file itself"
elif [ -e "$csv" ] && [ ! -f "$csv" ]; then
  usage "CSV $csv: is not a regular file"
fi
ladder=$(absolute "${LADDER:-$root/build-gpu/ladder}")
if ! [ -f "$ladder" ] || ! [ -x "$ladder" ]; then
  usage "LADDER $ladder: no such program (build it, or point LADDER at the ladder driver)"
fi
out=${OUT:-out}
[ -n "$out" ] || usage "OUT: an empty path names no folder"
log=$(absolute "$out")/alternate.log
mkdir -p "$(dirname "$csv")" "$(dirname "$log")" || usage "cannot make the folders of $csv and $log"
base=alt-$(date -u +%Y%m%dT%H%M%SZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
commit=${LADDER_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
status=0
for i in $(seq 1 "$passes"); do
  t0=$(date +%s)
  # shellcheck disable=SC2086
  "$ladder" bench --csv "$csv" --run-id "$base.$i" $bench_flags >>"$log" 2>&1 || status=1
  t1=$(date +%s)
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 python3 "$root/tools/peers.py" --csv "$csv" --commit "$commit" \
    --run-id "$base.$i" $peer_flags >>"$log" 2>&1 || status=1
  echo "alternation $i ($base.$i): rung $((t1 - t0)) s, peer $(($(date +%s) - t1)) s" | tee -a "$log"
done
echo "runs $base.1 .. $base.$passes in $csv (exit $status; log $log)"
exit $status
