#!/usr/bin/env python3
"""Cross-check one step of the attention ladder against PyTorch.

The Catch2 harness checks every step against the ladder's own float64 oracle (step 00).
This script checks a step against a library you already trust: for each shape it makes
inputs with torch, runs the step program on them (--load/--save), and compares O, LSE and,
with --backward, dQ, dK, dV with torch in float64.

  python3 tests/pytorch/check.py --bin build/steps/05_shared_memory_fa2
  python3 tests/pytorch/check.py --bin build/steps/06_tensor_core_fa2 --dtype bf16 --backward
  python3 tests/pytorch/check.py --bin build/steps/02_online_softmax \\
      --shapes 1,2,2,113,203,64,causal 2,4,1,64,64,32 -- --variant tiled

A shape is B,H,Hkv,M,N,d with an optional ",causal". Arguments after "--" go to the step
program unchanged (e.g. --variant, --tile-q).

Pass rule, the harness's (docs/CONTRACT.md): a tensor passes when its max abs error vs float64
is at most 2x (3x for gradients) the error of the same computation done by torch in the
step's dtype, plus eps(dtype) * max(1, max|ref|). NaN or Inf where the reference is
finite fails; LSE must be exactly -inf where the reference is. A float64 step (step 00)
is measured against numpy's extended precision instead, with torch's float64 as the
yardstick: two float64 programs legitimately differ by more than one eps.

Exit status: 0 every checked shape passed; 1 something failed; 2 bad arguments, or
every shape was skipped (nothing was checked); 3 the step found no CUDA device.
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"check.py needs numpy and torch ({e}): pip install numpy torch", file=sys.stderr)
    sys.exit(2)

DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
# Unit roundoff of each dtype, the tolerance floor's unit (as common/dtype.hpp).
EPS = {"fp64": 2.0**-52, "fp32": 2.0**-23, "fp16": 2.0**-10, "bf16": 2.0**-7}

# Odd shapes (B, H, Hkv, M, N, d, causal): lengths that are no tile multiple, seq_q != seq_k
# both ways, GQA and MQA, fully masked rows, a single query and key, both common head dims,
# and one odd head dim that fixed-dim steps report as skipped.
DEFAULT_SHAPES = [
    (1, 2, 2, 113, 203, 64, True),
    (2, 4, 2, 77, 129, 64, True),  # GQA, group of 2
    (1, 2, 1, 203, 17, 64, True),  # MQA; queries 0..185 see no key: O = 0, LSE = -inf
    (1, 2, 2, 1, 1, 64, True),
    (1, 1, 1, 300, 300, 128, False),
    (1, 4, 1, 129, 300, 128, True),  # MQA, d = 128, seq_q < seq_k
    (2, 3, 3, 50, 70, 40, False),  # a head dim no tensor-core step supports
]

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_NO_DEVICE = 0, 1, 2, 3


def parse_shape(text):
    parts = text.split(",")
    causal = False
    if parts and parts[-1] in ("causal", "c"):
        causal = True
        parts = parts[:-1]
    try:
        dims = tuple(int(x) for x in parts)
    except ValueError:
        dims = ()
    if len(dims) != 6 or min(dims) < 1:
        raise argparse.ArgumentTypeError(
            f"'{text}': expected B,H,Hkv,M,N,d (each >= 1) with an optional ',causal'")
    if dims[1] % dims[2]:
        raise argparse.ArgumentTypeError(f"'{text}': H must be a multiple of Hkv")
    return dims + (causal,)


def shape_str(shape):
    B, H, Hkv, M, N, d, causal = shape
    return f"B={B} H={H} Hkv={Hkv} M={M} N={N} d={d} {'causal' if causal else 'non-causal'}"


def parse_args(argv):
    extra = []
    if "--" in argv:  # everything after "--" is for the step program
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True,
                    help="the step program, e.g. build/steps/02_online_softmax")
    ap.add_argument("--dtype", choices=list(DTYPES), help="the step's dtype (default: its first)")
    ap.add_argument("--shapes", nargs="+", type=parse_shape, metavar="B,H,Hkv,M,N,d[,causal]",
                    help="shapes to check (default: a list of odd shapes)")
    ap.add_argument("--backward", action="store_true", help="also check dQ, dK, dV")
    ap.add_argument("--device", choices=["cuda", "cpu"],
                    help="where torch computes the yardstick, the attention in the step's "
                    "dtype (default: cuda if available); the reference is always on the CPU")
    ap.add_argument("--inputs", choices=["normal", "large"], default="normal",
                    help="large: q and k scaled by 6, logits in the hundreds")
    ap.add_argument("--scale", type=float, help="softmax scale (default 1/sqrt(d))")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="keep each shape's inputs and outputs under DIR")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per step run")
    args = ap.parse_args(argv)
    args.extra = extra
    args.shapes = args.shapes or DEFAULT_SHAPES
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    return args


def step_default_dtype(binary):
    """The step's first dtype, read from the 'Supports: fp32/..., d ...' line of its --help."""
    r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    for line in r.stdout.splitlines():
        if line.startswith("Supports: "):
            first = line[len("Supports: "):].split(",")[0].split("/")[0].strip()
            if first in DTYPES:
                return first
    raise RuntimeError(f"{binary} --help names no dtype on a 'Supports:' line")


# ---- inputs -------------------------------------------------------------------------------

def make_inputs(shape, dtype, seed, kind, backward):
    """Seeded inputs as the harness makes them (common/inputs.cpp), rounded to `dtype`.

    Normal values with a mean shift, so softmax is not flat (the mean logit is about
    0.25 sqrt(d)); every 13th key row is 3x larger, giving a few large logits. Returned
    as float64 CPU tensors holding exactly the values a step of `dtype` sees.
    """
    B, H, Hkv, M, N, d, _ = shape
    g = torch.Generator().manual_seed(seed)
    qk = 6.0 if kind == "large" else 1.0

    def fill(rows_shape, shift, scale, boost=1.0):
        x = (torch.randn(rows_shape, generator=g, dtype=torch.float64) + shift) * scale
        rows = torch.arange(rows_shape[-2])
        x[..., rows % 13 == 5, :] *= boost
        return x.to(DTYPES[dtype]).to(torch.float64)  # fp32/fp16/bf16 rounding: a dtype cast

    t = {
        "q": fill((B, H, M, d), 0.5, qk),
        "k": fill((B, Hkv, N, d), 0.5, qk, boost=3.0),
        "v": fill((B, Hkv, N, d), 0.25, 1.0),
    }
    if backward:
        t["do"] = fill((B, H, M, d), 0.0, 1.0)
    return t


def save_inputs(inputs, directory, dtype):
    # float32 holds fp32/fp16/bf16 values exactly; fp64 inputs stay float64.
    np_type = np.float64 if dtype == "fp64" else np.float32
    os.makedirs(directory, exist_ok=True)
    for name, t in inputs.items():
        np.save(os.path.join(directory, name + ".npy"), t.numpy().astype(np_type))


# ---- attention, three ways ------------------------------------------------------------------

def masks(M, N, causal, device="cpu"):
    """visible [M, N]: bottom-right causal, key j is visible to query i iff j <= i + N - M.
    empty [M, 1]: queries that see no key; they get O = 0, LSE = -inf, zero gradients."""
    i = torch.arange(M, device=device).unsqueeze(1)
    j = torch.arange(N, device=device).unsqueeze(0)
    visible = (j <= i + (N - M)) if causal else torch.ones(M, N, dtype=torch.bool, device=device)
    return visible, ~visible.any(dim=1, keepdim=True)


def reference(inputs, causal, scale):
    """The reference: attention written out in float64 on the CPU, gradients by autograd.

    S = scale Q K^T, masked, softmax, O = P V, LSE = logsumexp(S). GQA by repeating each
    K/V head over its group of query heads; autograd then sums the group's gradients.
    """
    backward = "do" in inputs
    q, k, v = (inputs[n].clone().requires_grad_(backward) for n in ("q", "k", "v"))
    B, H, M, d = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    kh = k.repeat_interleave(H // Hkv, dim=1)  # query head h reads K/V head h // (H / Hkv)
    vh = v.repeat_interleave(H // Hkv, dim=1)
    visible, empty = masks(M, N, causal)
    s = (q @ kh.transpose(-1, -2)) * scale
    # Softmax of an all -inf row is NaN: rows with no visible key get finite logits here and
    # are zeroed after, which also zeroes their gradients.
    s = s.masked_fill(~visible, -math.inf).masked_fill(empty, 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0)
    o = p @ vh
    out = {"o": o, "lse": torch.logsumexp(s, dim=-1).masked_fill(empty[:, 0], -math.inf)}
    if backward:
        out["dq"], out["dk"], out["dv"] = torch.autograd.grad(o, (q, k, v), inputs["do"])
    return {name: t.detach() for name, t in out.items()}


def plain(inputs, causal, scale, dtype, device):
    """The yardstick: the same attention done plainly by torch in the step's dtype.

    fp32: fp32 throughout. fp16/bf16, as flash-attention's tests do: matmuls in that dtype
    (fp32 accumulation, rounded result), softmax and LSE in fp32, P rounded to the dtype.
    The backward is the one every FlashAttention kernel computes, dS = P (dP - D) with
    D = rowsum(dO O), not autograd's: autograd subtracts sum(P dP), which is exact on a
    row with a single visible key where D's rounding is not, and would fail a correct
    kernel there. Returns float64 CPU tensors.
    """
    t = DTYPES[dtype]
    acc = torch.float64 if dtype == "fp64" else torch.float32
    q, k, v = (inputs[n].to(device, t) for n in ("q", "k", "v"))
    B, H, M, d = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    g = H // Hkv
    kh, vh = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    visible, empty = masks(M, N, causal, device)
    s = (q @ kh.transpose(-1, -2)).to(acc) * scale
    s = s.masked_fill(~visible, -math.inf).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s, dim=-1).masked_fill(empty[:, 0], -math.inf)
    p = torch.softmax(s, dim=-1).masked_fill(empty, 0.0).to(t)
    o = p @ vh
    out = {"o": o, "lse": lse}
    if "do" in inputs:
        do = inputs["do"].to(device, t)
        dp = do @ vh.transpose(-1, -2)
        D = (do.to(acc) * o.to(acc)).sum(dim=-1, keepdim=True)
        ds = (p.to(acc) * (dp.to(acc) - D) * scale).to(t)  # scale folded in: one rounding
        out["dq"] = ds @ kh

        # A K/V head's gradient sums over every query row of its group: one product over
        # the group's g*M rows (heads h of a group are adjacent, so a reshape gathers them).
        def group(x):
            return x.reshape(B, Hkv, g * M, x.shape[-1])

        out["dk"] = group(ds).transpose(-1, -2) @ group(q)
        out["dv"] = group(p).transpose(-1, -2) @ group(do)
    return {name: x.to("cpu", torch.float64) for name, x in out.items()}


def extended(inputs, causal, scale):
    """The reference for a float64 step: plain() in numpy's long double (a 64-bit
    significand on x86-64), rounded to float64 at the end.

    Two correct float64 programs differ by tens of ulps here (exp amplifies the rounding
    of S), so a float64 step is measured against something more precise, with torch's
    float64 plain() as its yardstick, as torch's fp32 is for an fp32 step.
    """
    X = np.longdouble
    q, k, v = (inputs[n].numpy().astype(X) for n in ("q", "k", "v"))
    B, H, M, d = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    g = H // Hkv
    kh, vh = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    visible, empty = (x.numpy() for x in masks(M, N, causal))
    s = (q @ kh.swapaxes(-1, -2)) * X(scale)
    s = np.where(empty, 0, np.where(visible, s, -np.inf))
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(empty, 0, e / l)
    o = p @ vh
    out = {"o": o, "lse": np.where(empty[:, 0], -np.inf, (m + np.log(l))[..., 0])}
    if "do" in inputs:
        do = inputs["do"].numpy().astype(X)
        dp = do @ vh.swapaxes(-1, -2)
        ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) * X(scale)
        out["dq"] = ds @ kh

        def group(x):
            return x.reshape(B, Hkv, g * M, x.shape[-1])

        out["dk"] = group(ds).swapaxes(-1, -2) @ group(q)
        out["dv"] = group(p).swapaxes(-1, -2) @ group(do)
    return {name: torch.from_numpy(x.astype(np.float64)) for name, x in out.items()}


# ---- running the step and comparing -------------------------------------------------------

def run_step(args, dtype, shape, in_dir, out_dir):
    cmd = [args.bin, "--load", in_dir, "--save", out_dir, "--dtype", dtype,
           "--repeats", "1", "--warmup", "0"]
    if shape[6]:
        cmd.append("--causal")
    if args.backward:
        cmd.append("--backward")
    if args.scale is not None:
        cmd += ["--scale", repr(args.scale)]
    if dtype == "fp64":
        cmd.append("--save-f64")  # float32 files would hide a float64 step's accuracy
    cmd += args.extra
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout:g} s: {' '.join(cmd)}"
    message = (r.stderr.strip() or r.stdout.strip()).removeprefix("error: ")
    return r.returncode, message


def compare(got, ref):
    """max |got - ref| over finite reference elements, max |ref|, and the count of bad
    elements: non-finite where the reference is finite, or a wrong infinity (-inf LSE)."""
    finite = torch.isfinite(ref)
    bad = int((finite & ~torch.isfinite(got)).sum()) + int((~finite & (got != ref)).sum())
    ok = finite & torch.isfinite(got)
    err = float((got - ref).abs()[ok].max()) if ok.any() else 0.0
    ref_max = float(ref.abs()[finite].max()) if finite.any() else 0.0
    return err, ref_max, bad


def check_shape(args, dtype, shape, work_dir):
    """Runs one shape; returns 'pass', 'fail' or 'skip' (and exits 3 without a GPU)."""
    B, H, Hkv, M, N, d, causal = shape
    scale = args.scale if args.scale is not None else 1.0 / math.sqrt(d)
    in_dir, out_dir = os.path.join(work_dir, "in"), os.path.join(work_dir, "out")
    names = ["o", "lse"] + (["dq", "dk", "dv"] if args.backward else [])
    for name in names:  # a kept directory may hold an earlier run's outputs
        if os.path.exists(os.path.join(out_dir, name + ".npy")):
            os.remove(os.path.join(out_dir, name + ".npy"))
    inputs = make_inputs(shape, dtype, args.seed, args.inputs, args.backward)
    save_inputs(inputs, in_dir, dtype)

    rc, message = run_step(args, dtype, shape, in_dir, out_dir)
    if rc == EXIT_BAD_INPUT:
        print(f"  skipped: {message}")
        return "skip"
    if rc == EXIT_NO_DEVICE:
        print(f"  {message}\nthe step found no CUDA device: nothing checked")
        sys.exit(EXIT_NO_DEVICE)
    if rc is None or rc not in (EXIT_OK, EXIT_FAIL):
        how = "" if rc is None else f" (signal {-rc})" if rc < 0 else f" (exit {rc})"
        print(f"  FAIL: the step did not finish{how}: {message[-2000:]}")
        return "fail"
    # The step's own verdict (vs the ladder's oracle) is shown; torch's decides here.
    print(f"  step's own check vs the ladder's oracle: {'ok' if rc == EXIT_OK else 'FAIL'}")

    ref = extended(inputs, causal, scale) if dtype == "fp64" else reference(inputs, causal, scale)
    base = plain(inputs, causal, scale, dtype, args.device)
    print(f"  {'':4}{'max|ref|':>11}{'step err':>11}{'torch ' + dtype + ' err':>15}"
          f"{'tolerance':>11}{'err/tol':>9}  result")
    verdict = "pass"
    for name in names:
        path = os.path.join(out_dir, name + ".npy")
        if not os.path.exists(path):
            print(f"  {name:<4}missing {path}  FAIL")
            verdict = "fail"
            continue
        got = torch.from_numpy(np.load(path)).to(torch.float64)
        if got.shape != ref[name].shape:
            print(f"  {name:<4}shape {tuple(got.shape)}, expected {tuple(ref[name].shape)}  FAIL")
            verdict = "fail"
            continue
        err, ref_max, bad = compare(got, ref[name])
        base_err, _, _ = compare(base[name], ref[name])
        factor = 2.0 if name in ("o", "lse") else 3.0
        tol = factor * base_err + EPS[dtype] * max(1.0, ref_max)
        ok = bad == 0 and err <= tol
        note = f"  ({bad} non-finite or wrong -inf)" if bad else ""
        print(f"  {name:<4}{ref_max:11.3e}{err:11.3e}{base_err:15.3e}{tol:11.3e}"
              f"{err / tol:9.2f}  {'ok' if ok else 'FAIL'}{note}")
        if not ok:
            verdict = "fail"
    return verdict


def main(argv):
    args = parse_args(argv)
    if not os.access(args.bin, os.X_OK):
        print(f"--bin {args.bin}: not an executable program", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        dtype = args.dtype or step_default_dtype(args.bin)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"--bin {args.bin}: {e}; pass --dtype", file=sys.stderr)
        return EXIT_BAD_INPUT
    if dtype == "fp64" and np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
        print("--dtype fp64 needs numpy's long double to be wider than float64 (it is on "
              "x86-64 and aarch64 Linux, not on this platform)", file=sys.stderr)
        return EXIT_BAD_INPUT
    # The baseline is plain same-precision arithmetic: no TF32 for fp32, and fp16/bf16
    # GEMMs that accumulate in fp32 all the way (no reduced-precision split-K reductions).
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False

    print(f"{os.path.basename(args.bin)} vs torch {torch.__version__}: {dtype}, "
          f"{'forward + backward' if args.backward else 'forward'}, inputs {args.inputs}, "
          f"seed {args.seed}")
    print("reference: " + ("numpy long double (CPU)" if dtype == "fp64" else
                           "torch float64 with autograd (CPU)") +
          f"; yardstick: torch {dtype} ({args.device})")
    counts = {"pass": 0, "fail": 0, "skip": 0}
    for n, shape in enumerate(args.shapes):
        print(f"[{n + 1}/{len(args.shapes)}] {shape_str(shape)}")
        if args.keep:
            verdict = check_shape(args, dtype, shape, os.path.join(args.keep, f"shape{n + 1}"))
        else:
            with tempfile.TemporaryDirectory(prefix="ladder-torch-") as work_dir:
                verdict = check_shape(args, dtype, shape, work_dir)
        counts[verdict] += 1
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped")
    if counts["fail"]:
        return EXIT_FAIL
    if counts["pass"] == 0:
        print("nothing was checked: every shape was skipped")
        return EXIT_BAD_INPUT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
