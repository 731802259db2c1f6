#!/usr/bin/env python3
"""A small character-level GPT trained on the project's own text, once per attention.

    python3 python/train_gpt.py --attn sdpa rung6 rung7 --steps 300 --seed 0 --out out/gpt

Each --attn trains the same model from the same initial weights on the same batches (both
drawn from --seed), and only the attention differs: PyTorch's scaled_dot_product_attention
(sdpa) or a ladder rung through ladder_attention (rung6, rung7; rung5 with --precision
fp32). Mixed precision by autocast: fp32 master weights and optimizer state, matrix products
(and so q, k, v and the attention) in bf16.

Per run, DIR/<attn>.csv has step,loss,ms (ms: the step's GPU time between CUDA events
recorded on the stream, no synchronisation inside the loop) and DIR/<attn>.json a summary:
the final training loss (mean of the last 20 steps), the validation loss on the held-out
last 10 % of the corpus, and the median step time without the first 10 steps (warm-up).
plot_gpt.py DIR draws and compares them.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import ladder_torch  # the installed package (pip install ./python)
from corpus import build_corpus  # beside this script
from ladder_torch import RUNGS, ladder_attention

WARMUP_STEPS_EXCLUDED = 10  # from the step-time statistics: allocator, cuBLAS and cache warm-up
FINAL_WINDOW = 20  # training steps averaged into the final training loss


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int, attn: str):
        super().__init__()
        self.heads, self.attn = heads, attn
        # sdpa-f64: SDPA on q, k, v upcast to float64 (the output cast back): the rest of the
        # model as in the other runs, its attention exact; the tests' gradient yardstick.
        self.rung = None if attn.startswith("sdpa") else int(attn.removeprefix("rung"))
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # q, k, v as views of the projection ([B, T, 3, H, d] seen as [B, H, T, d]), as a model
        # hands them to SDPA: SDPA and rung 07 read them in place and return O in [B, T, H, d]
        # storage (the reshape below is then free); rung 06 copies them.
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.attn == "sdpa-f64":
            y = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
            y = y.to(q.dtype)
        elif self.rung is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = ladder_attention(q, k, v, causal=True, rung=self.rung)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, attn: str):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, attn)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int, d_model: int, heads: int, attn: str):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, attn) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied input and output embeddings
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2's init; residual output projections scaled down by depth
                std = (
                    0.02 / math.sqrt(2 * layers)
                    if name.endswith(("proj.weight", "2.weight"))
                    else 0.02
                )
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class StepClock:
    """Per-step times: on the GPU, CUDA events recorded on the stream (no synchronisation
    inside the loop, so the host keeps queueing ahead as in any training loop); on the CPU, the
    wall clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def start(self) -> None:
        if self.cuda:
            self.marks.append([torch.cuda.Event(enable_timing=True)])
            self.marks[-1][0].record()
        else:
            self.marks.append([time.perf_counter()])

    def stop(self) -> None:
        if self.cuda:
            self.marks[-1].append(torch.cuda.Event(enable_timing=True))
            self.marks[-1][1].record()
        else:
            self.marks[-1].append(time.perf_counter())

    def times_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [s.elapsed_time(e) for s, e in self.marks]
        return [(e - s) * 1000 for s, e in self.marks]


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to lr / 10."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch(data: torch.Tensor, offsets: torch.Tensor, context: int):
    idx = offsets[:, None] + torch.arange(context + 1, device=data.device)
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, 1:]


def check_attn(attn: str, precision: str, device: str) -> None:
    if attn in ("sdpa", "sdpa-f64"):
        return
    if not attn.startswith("rung") or not attn[4:].isdigit():
        raise SystemExit(f"--attn {attn}: expected sdpa or rungN (e.g. rung6)")
    n = int(attn[4:])
    if n not in RUNGS or RUNGS[n].device != device:
        here = ", ".join(f"rung{r.number}" for r in RUNGS.values() if r.device == device)
        raise SystemExit(f"--attn {attn}: not among the rungs that run on {device} ({here})")
    want = torch.bfloat16 if precision == "bf16" else torch.float32
    if want not in ladder_torch._native.capabilities(n):
        raise SystemExit(f"--attn {attn} does not take {want}: {ladder_torch.describe(n)}")


def train(attn: str, args, text: str, device: torch.device) -> dict:
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long, device=device)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]

    # The same weights and the same batches for every --attn: both from the seed alone.
    torch.manual_seed(args.seed)
    model = GPT(len(chars), args.context, args.layers, args.d_model, args.heads, attn).to(device)
    gen = torch.Generator().manual_seed(args.seed)
    offsets = torch.randint(
        0, len(train_data) - args.context - 1, (args.steps, args.batch), generator=gen
    )
    val_offsets = torch.randint(
        0, len(val_data) - args.context - 1, (args.eval_batches, args.batch), generator=gen
    )
    offsets, val_offsets = offsets.to(device), val_offsets.to(device)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    clock = StepClock(device)

    losses = []
    wall = time.perf_counter()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        clock.start()
        x, y = batch(train_data, offsets[step], args.context)
        with autocast:
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        clock.stop()
        losses.append(loss.detach())
    ms = clock.times_ms()  # synchronises
    wall = time.perf_counter() - wall
    loss_values = torch.stack(losses).float().cpu().tolist()

    model.eval()
    with torch.no_grad(), autocast:
        val = []
        for i in range(args.eval_batches):
            x, y = batch(val_data, val_offsets[i], args.context)
            logits = model(x)
            val.append(F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1)))
        val_loss = torch.stack(val).mean().item()

    out = Path(args.out)
    with open(out / f"{attn}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "ms"])
        for i, (loss, t) in enumerate(zip(loss_values, ms)):
            w.writerow([i, f"{loss:.6f}", f"{t:.4f}"])
    timed = ms[WARMUP_STEPS_EXCLUDED:] or ms
    summary = {
        "attn": attn,
        "steps": args.steps,
        "seed": args.seed,
        "batch": args.batch,
        "context": args.context,
        "layers": args.layers,
        "d_model": args.d_model,
        "heads": args.heads,
        "precision": args.precision,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(chars),
        "corpus_chars": len(text),
        "corpus_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "final_train_loss": statistics.fmean(loss_values[-FINAL_WINDOW:]),
        "last_50_train_loss_std": (
            statistics.pstdev(loss_values[-50:]) if len(loss_values) > 1 else 0.0
        ),
        "val_loss": val_loss,
        "step_ms_median": statistics.median(timed),
        "step_ms_mean": statistics.fmean(timed),
        "tokens_per_s": args.batch * args.context / (statistics.median(timed) / 1000),
        "wall_s": wall,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    (out / f"{attn}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"{attn:>6}: final train loss {summary['final_train_loss']:.4f}, val loss {val_loss:.4f}, "
        f"step {summary['step_ms_median']:.2f} ms (median of steps {WARMUP_STEPS_EXCLUDED}+), "
        f"{wall:.1f} s for {args.steps} steps"
    )
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--attn", nargs="+", default=["sdpa", "rung6", "rung7"], help="sdpa, rung6, rung7, ..."
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out/gpt")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30, help="learning-rate warm-up steps")
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test (fp32, rung0)"
    )
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print("train_gpt.py: no CUDA device (--device cpu runs a smoke test)", file=sys.stderr)
        return 3
    if args.device == "cpu" and args.precision != "fp32":
        raise SystemExit("--device cpu needs --precision fp32")
    for attn in args.attn:
        check_attn(attn, args.precision, args.device)
    if args.d_model % args.heads:
        raise SystemExit("--d-model must be a multiple of --heads")
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    text = build_corpus()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    print(
        f"corpus: {len(text)} characters, {len(set(text))} distinct, sha256 {digest}...; "
        f"model: {args.layers} layers, "
        f"d_model {args.d_model}, {args.heads} heads, context {args.context}, batch {args.batch}"
    )
    device = torch.device(args.device)
    for attn in args.attn:
        train(attn, args, text, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
