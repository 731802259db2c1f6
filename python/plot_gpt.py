#!/usr/bin/env python3
"""Compares the GPT runs of train_gpt.py: one figure with every loss curve, and the numbers.

    python3 python/plot_gpt.py out/gpt        # reads out/gpt/*.json and *.csv

Prints, per run, the final training loss (mean of the last 20 steps), the validation loss and
the median step time; then, for each run against sdpa, the two loss differences, the noise
they are judged against and the step-time ratio. The noise is the scatter of the training
loss over the last 50 steps (its standard deviation): how much the loss moves from batch to
batch at the end, which the mean of 20 steps shrinks by sqrt(20). Writes DIR/loss.svg and
DIR/loss.png (matplotlib; without it, the numbers only).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path


def read_run(directory: Path, attn: str) -> tuple[list[int], list[float]]:
    steps, losses = [], []
    with open(directory / f"{attn}.csv", newline="") as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            losses.append(float(row["loss"]))
    return steps, losses


def smooth(values: list[float], half: int = 5) -> list[float]:
    """Centred moving average over 2 * half + 1 steps (fewer at the ends): no lag."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - half) : i + half + 1]
        out.append(sum(window) / len(window))
    return out


def draw(directory: Path, runs: dict[str, dict]) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found: no figure (the numbers above are complete)")
        return []
    curves = {attn: read_run(directory, attn) for attn in runs}
    base = curves.get("sdpa")
    paired = base is not None and len(curves) > 1
    fig, axes = plt.subplots(
        2 if paired else 1,
        1,
        figsize=(7.5, 6.5 if paired else 4.5),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1.3]} if paired else None,
        squeeze=False,
    )
    ax = axes[0][0]
    colors = {}
    for attn, summary in runs.items():
        steps, losses = curves[attn]
        label = f"{attn}: val {summary['val_loss']:.3f}, {summary['step_ms_median']:.1f} ms/step"
        (line,) = ax.plot(steps, smooth(losses), label=label, linewidth=1.6)
        colors[attn] = line.get_color()
        ax.plot(steps, losses, color=line.get_color(), alpha=0.25, linewidth=0.7)
    first = next(iter(runs.values()))
    ax.set_title(
        f"char-level GPT ({first['layers']} layers, d_model {first['d_model']}, {first['heads']} "
        f"heads, context {first['context']}, batch {first['batch']}, {first['precision']}, "
        f"seed {first['seed']})",
        fontsize=9,
    )
    ax.set_ylabel("training loss\n(thin: per step; thick: mean of 11)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if paired:
        # Both runs see the same batch at every step, so the per-step difference isolates what
        # the attention's arithmetic changes, without the batch-to-batch scatter.
        dx = axes[1][0]
        for attn in runs:
            if attn == "sdpa":
                continue
            steps, losses = curves[attn]
            n = min(len(losses), len(base[1]))
            diff = [losses[i] - base[1][i] for i in range(n)]
            dx.plot(steps[:n], diff, color=colors[attn], linewidth=0.8, label=f"{attn} - sdpa")
        dx.axhline(0.0, color="black", linewidth=0.6)
        dx.set_ylabel("loss difference\n(same batch)")
        dx.grid(True, alpha=0.3)
        dx.legend(fontsize=8)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    paths = [directory / "loss.svg", directory / "loss.png"]
    fig.savefig(paths[0])
    fig.savefig(paths[1], dpi=150)
    plt.close(fig)
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, nargs="?", default=Path("out/gpt"))
    args = ap.parse_args()
    runs = {}
    for path in sorted(args.dir.glob("*.json")):
        summary = json.loads(path.read_text())
        if "attn" in summary and (args.dir / f"{summary['attn']}.csv").is_file():
            runs[summary["attn"]] = summary
    if not runs:
        print(f"no runs in {args.dir} (train_gpt.py --out {args.dir} writes them)", file=sys.stderr)
        return 1
    if "sdpa" in runs:  # the baseline first
        runs = {"sdpa": runs.pop("sdpa"), **runs}

    print(f"{'attn':>6} {'train loss':>10} {'val loss':>9} {'ms/step':>8} {'tokens/s':>10}  gpu")
    for attn, s in runs.items():
        print(
            f"{attn:>6} {s['final_train_loss']:10.4f} {s['val_loss']:9.4f} "
            f"{s['step_ms_median']:8.2f} {s['tokens_per_s']:10.0f}  {s['gpu']}"
        )
    base = runs.get("sdpa")
    status = 0
    for attn, s in runs.items():
        if base is None or attn == "sdpa":
            continue
        d_train = s["final_train_loss"] - base["final_train_loss"]
        d_val = s["val_loss"] - base["val_loss"]
        noise = max(s["last_50_train_loss_std"], base["last_50_train_loss_std"])
        within = abs(d_train) <= noise and abs(d_val) <= noise
        ratio = s["step_ms_median"] / base["step_ms_median"]
        print(
            f"{attn} - sdpa: train loss {d_train:+.4f}, val loss {d_val:+.4f}; noise (std of the "
            f"last 50 training losses) {noise:.4f}: {'within' if within else 'OUTSIDE'} noise"
        )
        print(
            f"{attn} / sdpa step time: {s['step_ms_median']:.2f} / {base['step_ms_median']:.2f} ms "
            f"= {ratio:.3f}x"
        )
        if not within or not math.isfinite(s["val_loss"]):
            status = 2
    for p in draw(args.dir, runs):
        print(f"wrote {p}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
