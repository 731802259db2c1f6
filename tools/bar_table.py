#!/usr/bin/env python3
"""Per-point medians of rung/peer ratios over alternations (tools/alternate.sh).

    tools/bar_table.py CSV [CSV ...] --rung 07 --peer torch-cudnn [--bar 1.05] [--runs PREFIX]
    tools/bar_table.py CSV --rung 07 --dropout-cost 0.1 [--bar 1.3]
    tools/bar_table.py CSV --by-commit --rung 07@NEW --peer 07@OLD      (an A/B of two commits)

A ratio pairs a rung row and a peer row of one run id (one alternation: both measured in the
same call, one process each); a point's figure is the median of its ratios over the runs that
have both. --dropout-cost P pairs the rung's rows at dropout P with its own rows at dropout 0 of
the same run, and reports time(P) / time(0) (the bar is then an upper bound). --by-commit names
each row step@commit and pairs the rows of pass i (run ids ending in .i, e.g. old.1 and new.1:
the A/B passes of one device call: passes of several calls in one file would collide), for a
rung measured against its own earlier build (tools/ab_sweep.sh's a-N.csv and b-N.csv, with
COMMIT_A and COMMIT_B set, or one file whose run ids end in the pass). Prints a Markdown
table and a summary line; exit status 0, or 2 for unreadable input or no paired point.
A CSV is read by the path rule of tools/pathargs.py (no link, FIFO or device; a UTF-8
byte-order mark before the header is accepted); one that cannot be read, lacks a column or has a
value that is not a number where one is needed is exit 2 with a one-line error naming the file
(and line). Text from the CSVs is escaped where it is written into the Markdown table.
"""
import argparse
import csv
import io
import math
import signal
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pathargs  # noqa: E402  (the path-argument rule of every tool)
from pathargs import PathError, md_text  # noqa: E402

NEEDED = ("step", "dtype", "dim", "causal", "seq_q", "direction", "ms", "run")


def read_rows(files):
    """[(file, line, row dict)] of every CSV; raises PathError for a file that cannot be read or
    lacks a column."""
    rows = []
    for f in files:
        text = pathargs.read_text(f, "CSV")
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            missing = [c for c in NEEDED if c not in (reader.fieldnames or [])]
            if missing:
                raise PathError(f"CSV {f}: no column {', '.join(missing)} (not a results file "
                                "of the schema in docs/CONTRACT.md?)")
            rows += [(f, line, r) for line, r in enumerate(reader, start=2)]
        except csv.Error as e:
            raise PathError(f"CSV {f}: not a CSV file ({e})") from None
    return rows


def number(text, kind, what):
    v = kind(str(text).strip())
    if not math.isfinite(v):
        raise ValueError(f"{what} = {text}")
    return v


def point(r):
    return (r["dtype"], number(r["dim"], int, "dim"), number(r["causal"], int, "causal"),
            number(r["seq_q"], int, "seq_q"), r["direction"],
            number(r.get("density", "1") or 1, float, "density"))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--rung", default="07", help="the rung's step column (default 07)")
    ap.add_argument("--peer", default="torch-cudnn", help="the peer's step column")
    ap.add_argument("--dropout", type=float, default=0.0, help="the dropout rate compared")
    ap.add_argument("--dropout-cost", type=float, metavar="P",
                    help="report the rung's own time at dropout P over its time at 0")
    ap.add_argument("--bar", type=float, help="the bar (a lower bound on speed ratios, an upper "
                    "bound on --dropout-cost)")
    ap.add_argument("--runs", default="", help="only run ids starting with this")
    ap.add_argument("--by-commit", action="store_true",
                    help="steps named step@commit, runs paired by their pass (run id suffix .i)")
    args = ap.parse_args()
    try:
        return table(args)
    except PathError as e:
        print(f"bar_table.py: error: {e}", file=sys.stderr)
        return 2


def table(args):
    # ms[(step, dropout, run)][point]
    ms = defaultdict(dict)
    for f, line, r in read_rows(args.csv):
        if None in r.values() or None in r:  # a short row (missing fields) or a long one
            raise PathError(f"CSV {f}:{line}: the row has fewer or more fields than the header")
        if not (r.get("run") or "").startswith(args.runs):
            continue
        step, run = r["step"], r["run"]
        try:
            if args.by_commit:
                step, run = f"{step}@{r['commit']}", run.rsplit(".", 1)[-1]
            key = (step, number(r.get("dropout", "0") or 0, float, "dropout"), run)
            t = number(r["ms"], float, "ms")
            if not t > 0:
                raise ValueError(f"ms = {r['ms']} (a time is above 0)")
            ms[key][point(r)] = t
        except (ValueError, KeyError) as e:
            raise PathError(f"CSV {f}:{line}: not a results row ({e})") from None
    runs = sorted({k[2] for k in ms})
    ratios = defaultdict(list)  # point -> one ratio per run
    cost = args.dropout_cost is not None
    for run in runs:
        if cost:
            num, den = ms.get((args.rung, args.dropout_cost, run)), ms.get((args.rung, 0.0, run))
        else:
            # speed ratio rung/peer = peer time / rung time
            num, den = ms.get((args.peer, args.dropout, run)), ms.get((args.rung, args.dropout, run))
        if not num or not den:
            continue
        for p in set(num) & set(den):
            ratios[p].append(num[p] / den[p])
    if not ratios:
        print("bar_table.py: no point has both rows in one run", file=sys.stderr)
        return 2
    what = (f"{args.rung} time at dropout {args.dropout_cost} / at 0" if cost else
            f"{args.rung} / {args.peer} (speed{'' if not args.dropout else f', dropout {args.dropout}'})")
    print(f"| dtype | d | causal | seq | dir | {md_text(what)}: median | per run |")
    print("|---|--:|--:|--:|---|--:|---|")
    meds = {}
    for p in sorted(ratios):
        meds[p] = statistics.median(ratios[p])
        each = " ".join(f"{x:.3f}" for x in ratios[p])
        dens = "" if p[5] == 1 else f" (density {p[5]:g})"
        print(f"| {md_text(p[0])} | {p[1]} | {p[2]} | {p[3]}{dens} | {md_text(p[4])} | "
              f"{meds[p]:.3f} | {each} |")
    vals = list(meds.values())
    n_runs = {len(v) for v in ratios.values()}
    line = (f"\n{len(vals)} points, {min(n_runs)}-{max(n_runs)} runs each; median ratio from "
            f"{min(vals):.3f} to {max(vals):.3f}")
    if args.bar is not None:
        ok = [v for v in vals if (v <= args.bar if cost else v >= args.bar)]
        line += f"; {len(ok)} of {len(vals)} meet the bar ({'<=' if cost else '>='} {args.bar})"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
