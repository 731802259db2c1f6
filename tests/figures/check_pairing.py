#!/usr/bin/env python3
"""figures.pairing: tools/figures.py pairs a rung with the peer of its own run.

  check_pairing.py SOURCE_DIR

Two calls at one commit: run A times step 06 (10 TFLOP/s) and FLASH (20) side by side; run B
then times FLASH alone (40). The README ratio must be A's 0.50x, not 0.25x against the later peer
row of the same commit. Rows of a file without the run column pair by commit.
"""
import csv
import io
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]) / "tools"))
import figures  # noqa: E402

SEQ, DIM = 4096, 64
BATCH, HEADS = figures.TOKENS // SEQ, figures.HIDDEN // DIM
HEADER = figures.COLUMNS + ["dropout", "density", "run"]


def row(step, tflops, commit, run):
    return [step, "bf16", BATCH, HEADS, HEADS, SEQ, SEQ, DIM, 0, "fwd", 1.0, tflops, 1.0, 0,
            "GPU", "13.0", commit, 0, 1, run]


def ratio(rows, header):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpu.csv"
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow(r[:len(header)])
        path.write_text(buf.getvalue(), encoding="utf-8")
        latest, history = figures.load(path), figures.load(path, latest=False)
    lines = figures.results_table(latest, history, "gpu", "gpu.csv", {}, [])
    cells = [l for l in lines if l.startswith("| `06`")]
    if len(cells) != 1:
        sys.exit(f"FAIL: expected one table row for step 06, got {cells}")
    return cells[0].split("|")[8].strip()


fails = 0
runs = [row("06", 10, "abc", "A"), row("torch-flash", 20, "abc", "A"),
        row("torch-flash", 40, "abc", "B")]
for name, got, want in [
        ("same run", ratio(runs, HEADER), "0.50×"),
        # Without the run column the rows carry run = commit:abc and pair by commit: the later
        # peer row of that commit.
        ("no run column: by commit", ratio(runs, HEADER[:-1]), "0.25×")]:
    ok = got == want
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: ratio {got} (want {want})")
sys.exit(1 if fails else 0)
