#!/usr/bin/env python3
"""B/A per point from tools/ab_sweep.sh's CSVs: the median TFLOP/s of each side over its passes.

    tools/ab_table.py OUTDIR [--tol 0.02]
Prints a Markdown table (one row per step, dtype, d, causal, seq and direction) and the range of
B/A; exits 1 if any point's B/A is below 1 - tol, 2 for missing or unreadable files (a link,
a FIFO or a device is refused: tools/pathargs.py; a row that is not of the results schema is a
one-line error naming the file and line). Text from the CSVs is escaped in the Markdown table.
"""
import argparse
import csv
import io
import math
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pathargs  # noqa: E402  (the path-argument rule of every tool)
from pathargs import PathError, md_text  # noqa: E402


def load(files):
    pts = {}
    for f in files:
        text = pathargs.read_text(f, "OUTDIR")
        try:
            for line, r in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
                try:
                    key = (r["step"], r["dtype"], int(r["dim"]), int(r["causal"]),
                           int(r["seq_q"]), r["direction"], r.get("dropout") or "0",
                           r.get("density") or "1")
                    v = float(r["tflops"])
                    if not (math.isfinite(v) and v > 0):
                        raise ValueError(f"tflops = {r['tflops']} (above 0 wanted)")
                except (KeyError, TypeError, ValueError) as e:
                    raise PathError(f"{f}:{line}: not a results row ({e})") from None
                pts.setdefault(key, []).append(v)
        except csv.Error as e:
            raise PathError(f"{f}: not a CSV file ({e})") from None
    return pts


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--tol", type=float, default=0.02)
    args = ap.parse_args()
    try:
        out = pathargs.input_dir(args.outdir, "OUTDIR")
        a_files, b_files = sorted(out.glob("a-*.csv")), sorted(out.glob("b-*.csv"))
        if not a_files or not b_files:
            raise PathError(f"no a-*.csv or b-*.csv in {out}")
        a, b = load(a_files), load(b_files)
    except PathError as e:
        print(f"ab_table.py: error: {e}", file=sys.stderr)
        return 2
    keys = sorted(set(a) & set(b))
    print(f"| step | dtype | d | causal | seq | dir | A TFLOP/s | B TFLOP/s | B/A |")
    print("|---|---|--:|--:|--:|---|--:|--:|--:|")
    ratios = []
    for k in keys:
        ma, mb = statistics.median(a[k]), statistics.median(b[k])
        ratios.append(mb / ma)
        print(f"| {md_text(k[0])} | {md_text(k[1])} | {k[2]} | {k[3]} | {k[4]} | "
              f"{md_text(k[5])} | {ma:.1f} | {mb:.1f} | {mb / ma:.3f} |")
    if not ratios:
        print("ab_table.py: error: no point measured on both sides", file=sys.stderr)
        return 2
    low = [r for r in ratios if r < 1 - args.tol]
    print(f"\n{len(ratios)} points; B/A from {min(ratios):.3f} to {max(ratios):.3f}, median "
          f"{statistics.median(ratios):.3f}; {len(low)} below {1 - args.tol:.2f} "
          f"({len(a_files)} and {len(b_files)} passes)")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
