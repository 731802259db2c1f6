#!/usr/bin/env python3
"""The worst error/tolerance ratio per rung, dtype and output, from harness logs.

The harness (tests/harness.cpp) prints one verdict line per run of a shared case:
    "  pass odd17 bf16 fwd+bwd [default]  O 1.2e-03/4.5e-03  LSE ..."
This reads such logs (ctest -V output or the harness's own) and prints a Markdown table of
the largest error/tolerance per (step, dtype, tensor) with the case it came from: how much
margin every rung has under the rule the log was made with (below 1 passes).

    tools/harness_table.py LOG [LOG ...]          # one table, rows from every log
    tools/harness_table.py --label new A --label old B   # two rules side by side
Exit status: 0, or 2 for a missing or unreadable file (a link, a FIFO or a device is refused:
tools/pathargs.py) or a log without verdict lines. Text from the logs (case names, variants) is
escaped in the Markdown table.
"""
import argparse
import re
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pathargs  # noqa: E402  (the path-argument rule of every tool)
from pathargs import md_text  # noqa: E402

VERDICT = re.compile(r"^\s*(?:\d+: )?\s*(pass|FAIL) (\S+) (fp64|fp32|fp16|bf16) (fwd\+bwd|fwd) \[([^\]]*)\]\s+(.*)$")
STEP = re.compile(r"^\s*(?:\d+: )?step (\d\d_\w+): \d+ runs of shared cases")
PAIR = re.compile(r"(O|LSE|dQ|dK|dV) ([-+0-9.eE]+|nan|inf)/([-+0-9.eE]+)")


def worst(path):
    """{(step, dtype, tensor): (ratio, case)} and the number of verdict lines."""
    rows, step, n = {}, "?", 0
    try:
        lines = pathargs.read_bytes(path, "LOG").decode("utf-8", "replace").splitlines()
    except pathargs.PathError as e:
        print(f"harness_table.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    for line in lines:
        m = STEP.match(line)
        if m:
            step = m.group(1)
            continue
        m = VERDICT.match(line)
        if not m:
            continue
        n += 1
        _, case, dtype, _, variant, rest = m.groups()
        for tensor, err, tol in PAIR.findall(rest):
            e, t = float(err), float(tol)
            r = e / t if t > 0 else (0.0 if e == 0 else float("inf"))
            key = (step, dtype, tensor)
            if key not in rows or r > rows[key][0]:
                rows[key] = (r, f"{case} [{variant}]")
    if n == 0:
        print(f"harness_table.py: error: {path}: no harness verdict lines", file=sys.stderr)
        sys.exit(2)
    return rows


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="*", help="harness logs (one rule)")
    ap.add_argument("--label", nargs=2, action="append", metavar=("NAME", "LOG"),
                    help="a named log; give two to compare rules side by side")
    a = ap.parse_args()
    sets = [(name, worst(log)) for name, log in (a.label or [])]
    if a.logs:
        merged = {}
        for log in a.logs:
            for k, v in worst(log).items():
                if k not in merged or v[0] > merged[k][0]:
                    merged[k] = v
        sets.insert(0, ("error/tol", merged))
    if not sets:
        ap.error("give at least one log")
    keys = sorted(set().union(*[s.keys() for _, s in sets]),
                  key=lambda k: (k[0], k[1], ["O", "LSE", "dQ", "dK", "dV"].index(k[2])))
    head = ("| step | dtype | output | " + " | ".join(f"{md_text(n)} (worst case)" for n, _ in sets)
            + " |")
    print(head)
    print("|" + "---|" * (3 + len(sets)))
    for k in keys:
        cells = []
        for _, s in sets:
            r = s.get(k)
            cells.append("—" if r is None else f"{r[0]:.3f} ({md_text(r[1])})")
        print(f"| {md_text(k[0])} | {k[1]} | {k[2]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
