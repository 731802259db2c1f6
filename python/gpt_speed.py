#!/usr/bin/env python3
"""The GPT's training-step time with each attention, and where a step spends it.

    python3 python/gpt_speed.py time --contexts 256 1024 2048 --attn sdpa rung7 rung6 \
        --csv out/gpt_speed.csv
    python3 python/gpt_speed.py profile --context 256 --attn sdpa rung7 --out out/gpt_profile
    python3 python/gpt_speed.py op --contexts 256 1024 2048 --attn sdpa rung7

time: train_gpt.py's model and step (bf16 autocast, AdamW, clipping) on random tokens, the
batch chosen so that every context trains 16384 tokens per step (64 x 256, 16 x 1024,
8 x 2048). Per context, the attentions take turns in rounds (warm-up steps, then timed steps,
per round) so that drift of clocks or temperature falls on all of them alike; a step's time is
CUDA events around it (no synchronisation inside), the row the median over every round; host_ms
is the median time the host takes to issue a step (the Python call, without waiting for the
GPU): where it is close to step_ms, the step waits on the host, not on the kernels. Rows:
commit, gpu, torch, context, batch, attn, step_ms, host_ms, ratio to sdpa, the operator's
counters (rung 07's plans and calls, the layout copies).

profile: torch.profiler over a few steps per attention: the table of CUDA time and CPU (host)
time per operator, the kernels with their launch counts, and a Chrome trace to open in
Perfetto; enough to see whether a step waits on the host (per-call overhead, allocations,
copies, plans) or on kernels (which, and how many launches).

op: the attention call alone at the model's shapes (q, k, v views of one layer's projection,
causal, bf16): per forward + backward, the host's issue time (no synchronisation; the GPU kept
idle enough that it never throttles the host) and the GPU time (CUDA events, synchronised),
each the median of the rounds; the operator's share of a step, without the rest of the model.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ladder_torch
from train_gpt import GPT, Attention, lr_at

TOKENS_PER_STEP = 16384
VOCAB = 113  # the corpus's distinct characters in the committed runs; speed does not depend on it


def commit() -> str:
    """The commit the rows are stamped with: $LADDER_COMMIT (as tools/gpu_check.sh sets it), else
    git's, else "unknown"."""
    if os.environ.get("LADDER_COMMIT", "").strip():
        return os.environ["LADDER_COMMIT"].strip()
    try:
        here = Path(__file__).resolve().parent
        git = ["git", "-C", str(here)]
        out = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def make(attn: str, context: int, args):
    torch.manual_seed(0)
    model = GPT(VOCAB, context, args.layers, args.d_model, args.heads, attn).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=True)
    batch = TOKENS_PER_STEP // context
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, VOCAB, (4, batch, context + 1), generator=gen).cuda()
    state = {"i": 0}

    def step():
        x = data[state["i"] % 4]
        state["i"] += 1
        for g in opt.param_groups:
            g["lr"] = lr_at(state["i"], 1000, 1e-3, 30)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step, batch


def counters() -> dict:
    if ladder_torch._native.why_unavailable("cuda"):
        return {}
    return {
        n: int(v) for n, v in (l.split() for l in torch.ops.ladder.cuda_counters().splitlines())
    }


def time_steps(args) -> int:
    rows = []
    for context in args.contexts:
        steps = {a: make(a, context, args) for a in args.attn}
        times = {a: [] for a in args.attn}
        host = {a: [] for a in args.attn}
        for _ in range(args.rounds):
            for attn, (step, _) in steps.items():
                for _ in range(args.warmup):
                    step()
                marks = []
                for _ in range(args.steps):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True
                    )
                    t0 = time.perf_counter()
                    s.record()
                    step()
                    e.record()
                    host[attn].append(1e3 * (time.perf_counter() - t0))
                    marks.append((s, e))
                torch.cuda.synchronize()
                times[attn] += [s.elapsed_time(e) for s, e in marks]
        base = statistics.median(times["sdpa"]) if "sdpa" in times else None
        for attn in args.attn:
            ms = statistics.median(times[attn])
            row = dict(
                commit=commit(),
                gpu=torch.cuda.get_device_name(),
                torch=torch.__version__,
                context=context,
                batch=steps[attn][1],
                attn=attn,
                step_ms=f"{ms:.3f}",
                host_ms=f"{statistics.median(host[attn]):.3f}",
                ratio_to_sdpa=f"{ms / base:.3f}" if base else "",
                steps=len(times[attn]),
                **{k.replace(".", "_"): v for k, v in counters().items()},
                run=args.run_id,
            )
            rows.append(row)
            print(
                f"context {context:5d} batch {row['batch']:3d} {attn:>6}: {ms:8.3f} ms"
                f" (host {row['host_ms']} ms)"
                + (f"  ({ms / base:.3f}x sdpa)" if base else ""),
                flush=True,
            )
    if args.csv:
        path = Path(args.csv)
        path.parent.mkdir(parents=True, exist_ok=True)
        fields = list(rows[0])  # every row has the same columns (the counters' too)
        new = not path.exists()
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            if new:
                w.writeheader()
            w.writerows(rows)
    return 0


def profile(args) -> int:
    from torch.profiler import ProfilerActivity, profile as torch_profile, schedule

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for attn in args.attn:
        step, batch = make(attn, args.context, args)
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        before = counters()
        sched = schedule(wait=0, warmup=1, active=args.steps, repeat=1)
        with torch_profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            schedule=sched,
            record_shapes=True,
        ) as prof:
            for _ in range(args.steps + 1):
                step()
                prof.step()
        torch.cuda.synchronize()
        after = counters()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        host = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
        text = (
            f"{attn}, context {args.context}, batch {batch}, {args.steps} steps, "
            f"commit {commit()}\n"
            f"the operator's counters during the profile: "
            f"{ {k: after[k] - before.get(k, 0) for k in after} }\n\n"
            f"== by CUDA time\n{table}\n\n== by host (CPU) time\n{host}\n"
        )
        (out / f"{attn}_ctx{args.context}.txt").write_text(text)
        prof.export_chrome_trace(str(out / f"{attn}_ctx{args.context}.json"))
        print(text, flush=True)
    return 0


def time_op(args) -> int:
    """The attention call alone, forward + backward, at each context's shapes: host and GPU; then
    one attention layer (train_gpt's Attention: the qkv projection, its views, the call, the
    output projection) the same way, which adds what the views and their gradients cost."""
    for context in args.contexts:
        batch = TOKENS_PER_STEP // context
        d = args.d_model // args.heads
        x = torch.randn(batch, context, 3, args.heads, d, device="cuda", dtype=torch.bfloat16)
        qkv = x.permute(2, 0, 3, 1, 4)
        h = torch.randn(batch, context, args.d_model, device="cuda", dtype=torch.bfloat16)
        for attn in args.attn:
            q, k, v = (t.detach().requires_grad_(True) for t in qkv.unbind(0))
            rung = None if attn == "sdpa" else int(attn.removeprefix("rung"))
            dy = torch.randn_like(q).transpose(1, 2).contiguous().transpose(1, 2)
            layer = Attention(args.d_model, args.heads, attn).cuda().to(torch.bfloat16)
            hx = h.detach().requires_grad_(True)

            def call():
                if rung is None:
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:
                    y = ladder_torch.ladder_attention(q, k, v, causal=True, rung=rung)
                y.backward(dy)

            def call_layer():
                layer(hx).sum().backward()

            for what, fn in (("call", call), ("layer", call_layer)):
                host, gpu = _time_calls(fn, args)
                print(
                    f"context {context:5d} batch {batch:3d} {attn:>6} {what:>5}: host {host:7.1f} us,"
                    f" GPU {gpu:7.1f} us per forward + backward",
                    flush=True,
                )
    return 0


def _time_calls(fn, args) -> tuple[float, float]:
    """Median over rounds of the host's issue time and the GPU time per call of fn (us)."""
    for _ in range(args.warmup):
        fn()
    torch.cuda.synchronize()
    hosts, gpus = [], []
    for _ in range(args.rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        for _ in range(args.calls):
            fn()
        e.record()
        hosts.append(1e6 * (time.perf_counter() - t0) / args.calls)
        torch.cuda.synchronize()
        gpus.append(1e3 * s.elapsed_time(e) / args.calls)
    return statistics.median(hosts), statistics.median(gpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("time")
    t.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2048])
    t.add_argument("--attn", nargs="+", default=["sdpa", "rung7", "rung6"])
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--steps", type=int, default=20, help="timed steps per round")
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--csv", default="", help="append the rows to this CSV")
    t.add_argument(
        "--run-id",
        default=f"gpt-{os.getpid()}-{int(time.time())}",
        help="the run column: one id per process, so that a ratio pairs rows of one process",
    )
    p = sub.add_parser("profile")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--attn", nargs="+", default=["sdpa", "rung7"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", default="out/gpt_profile")
    o = sub.add_parser("op")
    o.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2048])
    o.add_argument("--attn", nargs="+", default=["sdpa", "rung7"])
    o.add_argument("--rounds", type=int, default=7)
    o.add_argument("--calls", type=int, default=6, help="calls per round (a model's layers)")
    o.add_argument("--warmup", type=int, default=5)
    for q in (t, p, o):
        q.add_argument("--layers", type=int, default=6)
        q.add_argument("--d-model", type=int, default=384)
        q.add_argument("--heads", type=int, default=6)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpt_speed.py: needs a CUDA device", file=sys.stderr)
        return 3
    if args.cmd == "time" and "sdpa" not in args.attn:
        args.attn = ["sdpa", *args.attn]  # the ratio's denominator
    return {"time": time_steps, "profile": profile, "op": time_op}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
