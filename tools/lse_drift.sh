#!/usr/bin/env bash
# The LSE error of rungs 06 and 07 against the sequence length (1k to 32k, d 64 and 128, bf16 and
# fp16), as built and with the rescale fault (common/fault.hpp: the online-softmax rescale that
# is 2^eps, not 1, when the row max holds), one CSV with both builds (tests/lse_drift.cpp).
#   tools/lse_drift.sh BUILD_DIR OUT.csv
# Needs a CUDA device (and sm_90a for rung 07); builds its four programs on demand.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: tools/lse_drift.sh BUILD_DIR OUT.csv" >&2
  exit 2
fi
build=$1 out=$2
tmp=$(mktemp)
trap 'rm -f "$tmp" "$tmp.part"' EXIT
header=""
for nn in 06 07; do
  for kind in default fault_rescale; do
    target=lse_drift_${kind}_$nn
    cmake --build "$build" --target "$target" >/dev/null
    "$build/tests/$target" --step "$nn" --build "${kind/default/fixed}" >"$tmp.part"
    [ -n "$header" ] || { header=$(head -n 1 "$tmp.part"); echo "$header" >"$tmp"; }
    tail -n +2 "$tmp.part" >>"$tmp"
  done
done
rm -f "$tmp.part"
mv "$tmp" "$out"
column -s, -t <"$out"
