#!/usr/bin/env python3
"""Loss parity of the GPT's training with a rung against SDPA, by a criterion that could fail.

    python3 python/loss_parity.py --attn rung6 rung7 --seeds 0 1 2 --steps 300 --out out/parity
    python3 python/loss_parity.py --attn rung0 --seeds 0 --steps 5 --out /tmp/p -- --device cpu \
        --precision fp32 --batch 2 --context 16 --layers 1 --d-model 32 --heads 2  # CPU smoke

For each seed, train_gpt.py trains the same model on the same batches with SDPA, with each rung,
and with SDPA on float64 q, k, v (sdpa-f64: the rest of the model in bf16 autocast as in every
run, only the attention exact). All bf16 runs drift away from the float64-attention run by the
rounding of their attention (P rounded to bf16 before PV, orders of summation), and the drift
grows as training amplifies it. The criterion compares like with like, step by step on the same
batch: a rung's mean |loss - loss_f64| over the steps, averaged over the seeds, may be at most
2x SDPA's (the ladder harness's factor for a rung against a plain computation in its precision),
plus 1e-5 (the CSVs' resolution).
A wrong gradient, even a small one, adds a systematic drift on top of the rounding noise.

Prints a table per seed and the verdict; writes DIR/parity.json; exit status 1 if a rung fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FACTOR = 2.0
FLOOR = 1e-5  # ten units of the last digit train_gpt.py writes a loss with


def losses(path: Path) -> list[float]:
    with open(path) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attn", nargs="+", default=["rung6", "rung7"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="out/parity")
    ap.add_argument("--reuse", action="store_true", help="read existing CSVs, train nothing")
    ap.add_argument("train_args", nargs="*", help="after --: more train_gpt.py arguments")
    args = ap.parse_args()
    out = Path(args.out)
    result = {"factor": FACTOR, "steps": args.steps, "seeds": {}, "verdict": {}}
    drift = {a: [] for a in ["sdpa", *args.attn]}
    for seed in args.seeds:
        folder = out / f"seed{seed}"
        if not args.reuse:
            cmd = [
                sys.executable,
                str(HERE / "train_gpt.py"),
                "--attn",
                "sdpa-f64",
                "sdpa",
                *args.attn,
                "--steps",
                str(args.steps),
                "--seed",
                str(seed),
                "--out",
                str(folder),
                *args.train_args,
            ]
            if subprocess.call(cmd):
                return 2
        exact = losses(folder / "sdpa-f64.csv")
        row = {}
        for attn in drift:
            d = [abs(a - b) for a, b in zip(losses(folder / f"{attn}.csv"), exact)]
            row[attn] = {"mean_abs_diff": statistics.fmean(d), "max_abs_diff": max(d)}
            drift[attn].append(row[attn]["mean_abs_diff"])
        result["seeds"][seed] = row
        print(
            f"seed {seed}: mean |loss - loss_f64| per step: "
            + ", ".join(
                f"{a} {v['mean_abs_diff']:.5f} (max {v['max_abs_diff']:.4f})"
                for a, v in row.items()
            )
        )
    base = statistics.fmean(drift["sdpa"])
    status = 0
    for attn in args.attn:
        mine = statistics.fmean(drift[attn])
        ok = mine <= FACTOR * base + FLOOR
        status |= not ok
        result["verdict"][attn] = {"mean_abs_diff": mine, "sdpa": base, "pass": ok}
        print(
            f"{attn}: {mine:.5f} against SDPA's {base:.5f} (limit {FACTOR * base + FLOOR:.5f}): "
            + ("PASS" if ok else "FAIL")
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "parity.json").write_text(json.dumps(result, indent=2) + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
