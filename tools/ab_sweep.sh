#!/usr/bin/env bash
# Same-call A/B speed sweep: two builds of the ladder (say the commit before a refactor and
# after) measured alternately, A B A B ..., so that both see the same GPU, clocks and
# neighbours; tools/ab_table.py then gives each point's median over the passes and B/A, and
# tools/bar_table.py --by-commit the median of the per-pass ratios (pass N of both sides shares
# the run id <base>.N).
#   tools/ab_sweep.sh LADDER_A LADDER_B PASSES OUTDIR [ladder bench flags...]
# e.g. tools/ab_sweep.sh /tmp/old/ladder build-gpu/ladder 2 out --preset flash --steps 7 \
#        --dtype bf16,fp16
# Writes OUTDIR/a-N.csv and OUTDIR/b-N.csv (each build's own results schema) and a log.
# COMMIT_A and COMMIT_B, when set, stamp each side's rows (LADDER_COMMIT for that binary): a
# build's own guess is the commit of the tree it runs in, which for an exported old tree is none.
# PASSES is a whole number, 1 to 999999; bad arguments are exit status 2 (else 0, or 1 when a
# pass failed: see OUTDIR/ab.log).
set -uo pipefail
usage() {
  echo "ab_sweep.sh: error: $*" >&2
  echo "usage: tools/ab_sweep.sh LADDER_A LADDER_B PASSES OUTDIR [ladder bench flags...]" >&2
  exit 2
}
[ $# -ge 4 ] || usage "at least 4 arguments wanted, $# given"
a=$1 b=$2 passes=$3 out=$4
shift 4
if ! [[ $passes =~ ^[0-9]{1,6}$ ]] || [ "$((10#$passes))" -lt 1 ]; then
  usage "PASSES '$passes': a whole number of passes, 1 to 999999"
fi
passes=$((10#$passes))
for bin in "$a" "$b"; do
  if ! [ -f "$bin" ] || ! [ -x "$bin" ]; then
    usage "$bin: no such program (LADDER_A and LADDER_B are two builds of the ladder driver)"
  fi
done
[ -n "$out" ] || usage "OUTDIR: an empty path names no folder"
if [ -L "$out" ] || { [ -e "$out" ] && [ ! -d "$out" ]; }; then
  usage "OUTDIR $out: not a folder (a link or a file)"
fi
mkdir -p "$out" || usage "OUTDIR $out: cannot be made"
base=ab-$(date -u +%Y%m%dT%H%M%SZ)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
status=0
for n in $(seq 1 "$passes"); do
  for side in a b; do
    bin=$a stamp=${COMMIT_A:-${LADDER_COMMIT:-}}
    [ "$side" = b ] && bin=$b stamp=${COMMIT_B:-${LADDER_COMMIT:-}}
    t0=$(date +%s)
    LADDER_COMMIT=$stamp "$bin" bench --csv "$out/$side-$n.csv" --run-id "$base.$n" "$@" \
      >>"$out/ab.log" 2>&1 || status=1
    echo "pass $n $side: $(($(date +%s) - t0)) s (exit $status)" | tee -a "$out/ab.log"
  done
done
exit $status
