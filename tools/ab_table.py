#!/usr/bin/env python3
"""B/A per point from tools/ab_sweep.sh's CSVs: the median TFLOP/s of each side over its passes.

    tools/ab_table.py OUTDIR [--tol 0.02]
Prints a Markdown table (one row per step, dtype, d, causal, seq and direction) and the range of
B/A; exits 1 if any point's B/A is below 1 - tol, 2 for missing or unreadable files.
"""
import argparse
import csv
import statistics
import sys
from pathlib import Path


def load(files):
    pts = {}
    for f in files:
        with open(f, newline="") as fh:
            for r in csv.DictReader(fh):
                key = (r["step"], r["dtype"], int(r["dim"]), int(r["causal"]), int(r["seq_q"]),
                       r["direction"], r.get("dropout", "0"), r.get("density", "1"))
                pts.setdefault(key, []).append(float(r["tflops"]))
    return pts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--tol", type=float, default=0.02)
    args = ap.parse_args()
    out = Path(args.outdir)
    a_files, b_files = sorted(out.glob("a-*.csv")), sorted(out.glob("b-*.csv"))
    if not a_files or not b_files:
        print(f"ab_table.py: no a-*.csv or b-*.csv in {out}", file=sys.stderr)
        return 2
    a, b = load(a_files), load(b_files)
    keys = sorted(set(a) & set(b))
    print(f"| step | dtype | d | causal | seq | dir | A TFLOP/s | B TFLOP/s | B/A |")
    print("|---|---|--:|--:|--:|---|--:|--:|--:|")
    ratios = []
    for k in keys:
        ma, mb = statistics.median(a[k]), statistics.median(b[k])
        ratios.append(mb / ma)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {k[5]} | {ma:.1f} | {mb:.1f} "
              f"| {mb / ma:.3f} |")
    if not ratios:
        print("ab_table.py: no point measured on both sides", file=sys.stderr)
        return 2
    low = [r for r in ratios if r < 1 - args.tol]
    print(f"\n{len(ratios)} points; B/A from {min(ratios):.3f} to {max(ratios):.3f}, median "
          f"{statistics.median(ratios):.3f}; {len(low)} below {1 - args.tol:.2f} "
          f"({len(a_files)} and {len(b_files)} passes)")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
