#!/usr/bin/env python3
"""tools.bar_table: tools/bar_table.py pairs a rung with its peer inside one alternation.

  check_bar_table.py SOURCE_DIR

Three alternations of one point: the rung takes 1.0 ms in each, the peer 1.1, 0.9 and 1.2 ms, so
the per-run ratios are 1.1, 0.9, 1.2 and the median 1.1 (not the ratio of the medians of some
other pairing). A fourth run holds the rung alone and must not pair. --by-commit pairs pass i of
an A/B (runs old.i and new.i) by the suffix, the two builds named step@commit; --dropout-cost
pairs the rung's own rows at p and at 0 of one run.
"""
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]) / "tools"))
import figures  # noqa: E402  (the results schema's columns)

TOOL = Path(sys.argv[1]) / "tools" / "bar_table.py"
HEADER = figures.COLUMNS + ["dropout", "density", "run"]


def row(step, ms, run, commit="c1", dropout=0):
    return [step, "bf16", 4, 32, 32, 4096, 4096, 64, 0, "bwd", ms, 1.0, 1.0, 0, "GPU", "13.0",
            commit, dropout, 1, run]


def table(rows, *args):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADER)
            w.writerows(rows)
        run = subprocess.run([sys.executable, str(TOOL), str(path), *args], capture_output=True,
                             text=True)
    out = run.stdout + run.stderr
    cells = [line.split("|") for line in out.splitlines() if line.startswith("| bf16")]
    if run.returncode != 0 or len(cells) != 1:
        return None, f"exit {run.returncode}, {len(cells)} rows: {out.strip()}", out
    return cells[0][6].strip(), cells[0][7].strip(), out


def main():
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    rows = []
    for i, peer in enumerate([1.1, 0.9, 1.2], 1):
        rows += [row("07", 1.0, f"alt.{i}"), row("torch-cudnn", peer, f"alt.{i}")]
    rows.append(row("07", 0.5, "alt.4"))  # no peer in that run
    med, each, out = table(rows, "--peer", "torch-cudnn", "--bar", "1.05")
    expect("median of the per-run ratios", med, "1.100")
    expect("one ratio per alternation", each, "1.100 0.900 1.200")
    expect("the bar's count", "1 of 1 meet the bar" in out, True)

    ab = []
    for i, (old, new) in enumerate([(1.0, 0.5), (1.0, 0.8), (2.0, 1.0)], 1):
        ab += [row("07", old, f"base.{i}", "aaa"), row("07", new, f"new.{i}", "bbb")]
    med, each, _ = table(ab, "--by-commit", "--rung", "07@bbb", "--peer", "07@aaa")
    expect("--by-commit: pass i of each side", each, "2.000 1.250 2.000")

    drop = [row("07", 1.0, "d.1"), row("07", 1.5, "d.1", dropout=0.1),
            row("07", 2.0, "d.2"), row("07", 2.6, "d.2", dropout=0.1)]
    med, each, _ = table(drop, "--dropout-cost", "0.1")
    expect("--dropout-cost: time at p over time at 0, per run", each, "1.500 1.300")

    for f in failures:
        print("FAIL", f)
    print("tools.bar_table:", "ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
