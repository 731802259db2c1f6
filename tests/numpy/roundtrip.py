#!/usr/bin/env python3
"""The step programs seen from NumPy: .npy files in, .npy files out, checked against an
attention written here in NumPy, independently of the C++ oracle.

    python3 roundtrip.py BUILD/steps

1. q, k, v (float64) for a causal GQA problem, seq_q=113 != seq_k=203, dim 64, saved with
   np.save; step 00 runs on them (--load, --save --save-f64) and its O and LSE must match
   a float64 NumPy computation (bottom-right mask) to 1e-12 relative.
2. Steps 01 and 02, every variant, on the same files (saved as float32): the harness's fp32
   rule, computed here: error vs float64 <= 2 x the error of a plain float32 computation
   + eps32 * max|ref|.
3. The same on a problem with seq_q > seq_k, whose first rows see no key: O = 0 and
   LSE = -inf exactly, in every step.
Exits 1 with a message naming each failed check.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def visible_mask(m, n, causal):
    """[m, n] bool: key j visible to query i iff j <= i + n - m (bottom-right causal)."""
    if not causal:
        return np.ones((m, n), dtype=bool)
    i = np.arange(m)[:, None]
    j = np.arange(n)[None, :]
    return j <= i + n - m


def expand_kv(k, heads):
    """GQA: query head h reads K/V head h // (heads // heads_kv)."""
    return np.repeat(k, heads // k.shape[1], axis=1)


def attention64(q, k, v, causal, scale):
    """Float64 attention from the definition; O = 0 and LSE = -inf where no key is visible."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    kk, vv = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    vis = visible_mask(q.shape[2], k.shape[2], causal)
    s = np.where(vis, scale * np.einsum("bhid,bhjd->bhij", q, kk), -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # rows with no visible key: avoid -inf - -inf
    p = np.exp(s - m)  # exp(-inf) = 0 for masked keys
    l = p.sum(axis=-1, keepdims=True)
    has = l > 0
    o = np.where(has, np.einsum("bhij,bhjd->bhid", p, vv) / np.where(has, l, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(has[..., 0], m[..., 0] + np.log(l[..., 0]), -np.inf)
    return o, lse


def attention32_plain(q, k, v, causal, scale):
    """The plain float32 computation the harness's tolerance is made of: every sum taken left
    to right in float32, as a first loop implementation does (no blocked BLAS sums)."""
    q, k, v = (x.astype(np.float32) for x in (q, k, v))
    kk, vv = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    b, h, mq, d = q.shape
    n = k.shape[2]
    s = np.zeros((b, h, mq, n), dtype=np.float32)
    for c in range(d):  # s_ij = sum_c q_ic k_jc, c in order
        s += q[:, :, :, c, None] * kk[:, :, None, :, c]
    s = np.float32(scale) * s
    vis = visible_mask(mq, n, causal)
    s = np.where(vis, s, np.float32(-np.inf))
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, np.float32(0))
    e = np.exp(s - m)
    l = np.zeros((b, h, mq, 1), dtype=np.float32)
    for j in range(n):
        l += e[..., j, None]
    has = l > 0
    p = e / np.where(has, l, np.float32(1))
    o = np.zeros((b, h, mq, d), dtype=np.float32)
    for j in range(n):  # o_i = sum_j p_ij v_j, j in order
        o += p[..., j, None] * vv[:, :, None, j, :]
    with np.errstate(divide="ignore"):
        lse = np.where(has[..., 0], m[..., 0] + np.log(l[..., 0]), np.float32(-np.inf))
    return o, lse


def make_inputs(rng, batch, heads, heads_kv, seq_q, seq_k, dim):
    """Normal values with a mean shift and a few keys scaled up: softmax is not flat."""
    q = rng.standard_normal((batch, heads, seq_q, dim)) + 0.5
    k = rng.standard_normal((batch, heads_kv, seq_k, dim)) + 0.5
    k[:, :, 5::13, :] *= 3.0
    v = rng.standard_normal((batch, heads_kv, seq_k, dim)) + 0.25
    return q, k, v


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def expect(self, ok, what):
        if ok:
            self.passed += 1
            print(f"  ok    {what}")
        else:
            self.failed.append(what)
            print(f"  FAIL  {what}")


def max_err(got, ref):
    """(max |got - ref| over finite ref, max |ref|, whether non-finite values are where and
    as the reference has them)."""
    fin = np.isfinite(ref)
    same_inf = np.array_equal(got[~fin], ref[~fin])
    if not np.all(np.isfinite(got[fin])):
        return np.inf, 0.0, same_inf
    if not fin.any():
        return 0.0, 0.0, same_inf
    return float(np.abs(got[fin] - ref[fin]).max()), float(np.abs(ref[fin]).max()), same_inf


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def variants_of(exe):
    """The variant names a step program lists under "Variants (--variant):" in --help."""
    rc, out = run([exe, "--help"])
    if rc != 0:
        raise RuntimeError(f"{exe} --help exited {rc}:\n{out}")
    names, inside = [], False
    for line in out.splitlines():
        if line.startswith("Variants (--variant):"):
            inside = True
        elif inside and line.startswith("  ") and ":" in line:
            names.append(line.strip().split(":")[0].replace(" (default)", ""))
        elif inside:
            break
    if not names:
        raise RuntimeError(f"{exe} --help lists no variants:\n{out}")
    return names


def check_problem(steps_dir, work, label, shape, causal, seed, checks):
    batch, heads, heads_kv, seq_q, seq_k, dim = shape
    rng = np.random.default_rng(seed)
    q, k, v = make_inputs(rng, batch, heads, heads_kv, seq_q, seq_k, dim)
    scale = 1.0 / np.sqrt(dim)
    inp = os.path.join(work, label, "in")
    os.makedirs(inp)
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(inp, name + ".npy"), x)  # float64, C order
    flags = ["--causal"] if causal else []
    masked_rows = int((~visible_mask(seq_q, seq_k, causal)).all(axis=1).sum())
    print(f"{label}: batch {batch}, heads {heads}/{heads_kv}, seq {seq_q}x{seq_k}, dim {dim}"
          f"{', causal' if causal else ''} ({masked_rows} query rows see no key)")

    # Step 00, the oracle, saved in float64: agreement to roundoff.
    o64, lse64 = attention64(q, k, v, causal, scale)
    exe = os.path.join(steps_dir, "00_cpu_reference")
    out = os.path.join(work, label, "00")
    rc, log = run([exe, "--load", inp, "--save", out, "--save-f64", "--repeats", "1",
                   "--warmup", "0"] + flags)
    checks.expect(rc == 0, f"{label}: step 00 exits 0 (got {rc})" + ("" if rc == 0 else "\n" + log))
    if rc == 0:
        for name, ref in (("o", o64), ("lse", lse64)):
            got = np.load(os.path.join(out, name + ".npy"))
            ok_type = got.dtype == np.float64 and got.shape == ref.shape
            err, top, same_inf = max_err(got, ref)
            rel = err / max(top, 1e-300)
            checks.expect(ok_type and same_inf and rel <= 1e-12,
                          f"{label}: step 00 {name.upper()} {got.dtype} {got.shape} vs NumPy "
                          f"float64: rel err {rel:.2e} (<= 1e-12), infinities match: {same_inf}")

    # Steps 01 and 02 in fp32: the inputs they see are the float32 roundings of the files.
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    ref_o, ref_lse = attention64(q32, k32, v32, causal, scale)
    plain_o, plain_lse = attention32_plain(q32, k32, v32, causal, scale)
    for step in ("01_three_pass_softmax", "02_online_softmax"):
        exe = os.path.join(steps_dir, step)
        if not os.path.exists(exe):
            checks.expect(False, f"{step}: no program at {exe}")
            continue
        for variant in variants_of(exe):
            out = os.path.join(work, label, step + "_" + variant)
            rc, log = run([exe, "--load", inp, "--save", out, "--variant", variant,
                           "--repeats", "1", "--warmup", "0"] + flags)
            tag = f"{label}: {step} [{variant}]"
            checks.expect(rc == 0, f"{tag} exits 0 (got {rc})" + ("" if rc == 0 else "\n" + log))
            if rc != 0:
                continue
            for name, ref, plain in (("o", ref_o, plain_o), ("lse", ref_lse, plain_lse)):
                got = np.load(os.path.join(out, name + ".npy"))
                ok_type = got.dtype == np.float32 and got.shape == ref.shape
                err, top, same_inf = max_err(got.astype(np.float64), ref)
                plain_err, _, _ = max_err(plain.astype(np.float64), ref)
                tol = 2 * plain_err + EPS32 * top
                checks.expect(ok_type and same_inf and err <= tol,
                              f"{tag} {name.upper()} {got.dtype} {got.shape}: err {err:.2e} <= "
                              f"tol {tol:.2e} (plain fp32 {plain_err:.2e}), infinities match: "
                              f"{same_inf}")
            if masked_rows:
                o = np.load(os.path.join(out, "o.npy"))
                dead = ~visible_mask(seq_q, seq_k, causal).any(axis=1)
                checks.expect(np.all(o[:, :, dead, :] == 0),
                              f"{tag}: O is exactly 0 on the rows that see no key")


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: roundtrip.py BUILD/steps  (the folder of the step programs)",
              file=sys.stderr)
        return 2
    steps_dir = sys.argv[1]
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="ladder_numpy_") as work:
        check_problem(steps_dir, work, "gqa_causal", (1, 4, 2, 113, 203, 64), True, 2024, checks)
        check_problem(steps_dir, work, "masked_rows", (2, 2, 1, 50, 20, 16), True, 2025, checks)
    print(f"numpy.roundtrip: {checks.passed} passed, {len(checks.failed)} failed")
    if checks.failed:
        print("FAILED checks:", file=sys.stderr)
        for f in checks.failed:
            print("  " + f.splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
