#!/usr/bin/env python3
"""PyTorch's attention timed in the ladder's convention: the peers each rung is compared with.

  python3 tools/peers.py                              # default sweep, a table on stdout
  python3 tools/peers.py --csv out/h100.csv           # + rows of the results schema
  python3 tools/peers.py --backends flex --block-sparsity dense random:0.25 local:4
  python3 tools/peers.py --backends flash cudnn --dropout 0 0.1 --dims 128
  python3 tools/peers.py --selftest                   # the block-mask generator (no torch needed)

Peers (the `step` column): torch-flash, torch-cudnn, torch-efficient, torch-math (SDPA, one
backend forced at a time) and torch-flex (FlexAttention, compiled with torch.compile once per
shape; compile time is not timed). The math backend materialises B*H*N*N scores and is skipped
where they would not fit. Block-sparse configurations run on FlexAttention only, with a
BlockMask built from the ladder's own generator (random:RHO, local:W; mask block 128, composed
with the causal mask when causal), so the ladder and its peer compute on the same mask. Dropout
(--dropout P) runs on the SDPA backends that accept dropout_p; FlexAttention has none.

Conventions (docs/CONTRACT.md): Q, K, V, dO ~ N(0, 1) shaped [B, H, N, d] with B*N = --tokens
and H*d = --hidden; forward FLOPs 4*B*H*N*N*d, halved when causal, times the mask's density
(kept blocks / all blocks); backward 2.5x forward. CUDA events around each timed call, warm-up
calls first, the median of --repeats (>= 20 for CSV rows), L2 flushed between timed calls (a
memset of a buffer twice the L2). The forward is timed as in training (inputs require grad); the
backward is out.backward(dO) alone, on a fresh forward each time.

Every configuration is checked before it is timed, on its own full-size inputs: batch 0 and two
heads are recomputed in float64 (with the same block mask) and the output and gradients must
agree to a tolerance per dtype. Dropout cannot be compared element by element with another
generator; there the check is statistical: the deviation of O (and of dV) from the no-dropout
reference must have the variance that dropout at rate p gives, p/(1-p) * sum_j P_ij^2 V_jd^2
(within 0.75..1.33x), and no bias (kept weights scaled by 1/(1-p)). A configuration a backend
does not support is skipped with its reason; one that fails its check is skipped with the
error, and the exit status is then 1.

--csv adds rows of the results schema, header
  step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,
  workspace_bytes,gpu,cuda,commit,dropout,density,run
(a new file gets it; a file with another header is refused: one from before the run column is
migrated once with tools/migrate_results.py). Each row is added as it is measured, by a locked
read-merge-write (an flock of the file's folder, the file read as it is then, the row added, the
whole renamed over it: tools/pathargs.py), so two writers at once lose no rows. The --csv path
is checked before PyTorch or the device is asked for: an empty path, a symbolic link, a FIFO, a
device or a folder is refused with exit status 2 on any machine. The run column is --run-id, else a fresh id per
invocation; tools/gpu_check.sh gives the sweep and the peers of one call the same id, which is
how tools/figures.py pairs a rung with the peers timed beside it. GB/s counts compulsory traffic:
forward Q, K, V read and O written; backward Q, K, V, O, dO read and dQ, dK, dV written.
Exit status: 0 ok, 1 a check failed, 2 bad arguments or CSV file, 3 no PyTorch or no CUDA device.
"""
import argparse
import csv
import inspect
import io
import math
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import pathargs  # noqa: E402  (the path-argument rule of every tool)
COLUMNS_BEFORE_RUN = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,"
                      "tflops,gbps,workspace_bytes,gpu,cuda,commit,dropout,density")
COLUMNS = COLUMNS_BEFORE_RUN + ",run"
RUN_ID = re.compile(r"[A-Za-z0-9._:+-]{1,64}")  # as `ladder bench --run-id`: no quoting needed
BACKENDS = ("flash", "cudnn", "efficient", "math", "flex")
MASK_BLOCK = 128  # the contract's default mask block, Bm = Bn
MIN_CSV_REPEATS = 20

# ---------------------------------------------------------------------------------------------
# The block-mask generator of docs/CONTRACT.md ("Block-sparse masks"), in plain Python so that it
# reads like the contract and runs without torch.

U64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's Weyl increment


def splitmix64_mix(z):
    """SplitMix64's finaliser, on uint64 (Python ints masked to 64 bits)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def keep_threshold(rho):
    """round(rho * 2^24), halves away from zero as C++'s llround (Python's round() would send
    them to even)."""
    return int(math.floor(rho * (1 << 24) + 0.5))


def random_mask(batch, heads, n_i, n_j, rho, seed):
    """random:RHO, shape [batch, heads, n_i, n_j] flattened: block idx is kept iff the top 24
    bits of the (idx + 1)-th SplitMix64 output (seeded with `seed`) are below round(rho 2^24)."""
    cut = keep_threshold(rho)
    seed &= U64
    return [1 if (splitmix64_mix((seed + (idx + 1) * GOLDEN) & U64) >> 40) < cut else 0
            for idx in range(batch * heads * n_i * n_j)]


def local_mask(n_i, n_j, width):
    """local:W, shape [1, 1, n_i, n_j] flattened: a band of W key blocks ending at the diagonal
    block I' = I + (n_j - n_i), bottom-right aligned like the causal mask."""
    out = []
    for i in range(n_i):
        diag = i + n_j - n_i
        out += [1 if diag - width < j <= diag else 0 for j in range(n_j)]
    return out


def parse_sparsity(spec):
    """'dense', 'random:RHO' (0 <= RHO <= 1) or 'local:W' (W >= 1), as (kind, value)."""
    kind, _, arg = spec.partition(":")
    try:
        if kind == "dense" and not arg:
            return ("dense", None)
        if kind == "random" and 0.0 <= float(arg) <= 1.0:
            return ("random", float(arg))
        if kind == "local" and int(arg) >= 1:
            return ("local", int(arg))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"'{spec}': expected dense, random:RHO (RHO in [0, 1]) "
                                     "or local:W (W >= 1)")


def make_mask(spec, batch, heads, seq_q, seq_k, seed):
    """The mask a sparsity spec asks for: (shape [Bm, Hm, nI, nJ], flat 0/1 list), or None."""
    kind, value = spec
    n_i, n_j = -(-seq_q // MASK_BLOCK), -(-seq_k // MASK_BLOCK)
    if kind == "random":
        return (batch, heads, n_i, n_j), random_mask(batch, heads, n_i, n_j, value, seed)
    if kind == "local":
        return (1, 1, n_i, n_j), local_mask(n_i, n_j, value)
    return None


def spec_name(spec):
    kind, value = spec
    return kind if value is None else f"{kind}:{value:g}"


# Known answers. SplitMix64's published outputs for seed 0 and seed 1234567 (first three) check
# the finaliser and the Weyl sequence; the masks below were computed independently of this file
# (local:W by hand from the rule; random:RHO by the C++ generator of common/block_mask.cpp), so a
# mismatch on either side shows up here.
SELFTEST_SPLITMIX = [
    (0, [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]),
    (1234567, [6457827717110365317, 3203168211198807973, 9817491932198370423]),
]
SELFTEST_MASKS = [  # (spec, batch, heads, seq_q, seq_k, seed, expected)
    ("random:0.25", 2, 3, 4 * 128, 5 * 128, 42,
     "0100101000100001101001001000000000001001010000110001101000010001"
     "00000000100010001010010000001001010101000110001000100000"),
    ("random:0.5", 1, 2, 3 * 128, 7 * 128 - 5, 2**64 - 1,
     "001100010110101011111011100101101001111100"),
    ("random:0.1", 1, 1, 8 * 128, 8 * 128, 7,
     "0100000000000000000000000010000100001000000110000000100000000000"),
    ("random:0.9", 1, 1, 8 * 128, 8 * 128, 123456789,
     "1111111111111111111101111111111111011111111111111111101101111111"),
    ("random:0", 1, 2, 256, 384, 5, "0" * 12),
    ("random:1", 1, 2, 256, 384, 5, "1" * 12),
    ("local:2", 3, 2, 4 * 128, 4 * 128, 0, "1000" "1100" "0110" "0011"),
    ("local:2", 1, 1, 2 * 128, 5 * 128, 0, "00110" "00011"),
    ("local:3", 1, 1, 5 * 128 - 1, 2 * 128 + 1, 0, "000" "000" "100" "110" "111"),
]


def selftest():
    failed = 0
    for seed, want in SELFTEST_SPLITMIX:
        got = [splitmix64_mix((seed + i * GOLDEN) & U64) for i in (1, 2, 3)]
        ok = got == want
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} SplitMix64 seed {seed}: "
              + " ".join(f"{x:016x}" for x in got))
    for rho, want in ((0.25, 1 << 22), (1.5 / (1 << 24), 2), (2.5 / (1 << 24), 3), (1.0, 1 << 24)):
        ok = keep_threshold(rho) == want
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} round(rho 2^24) for rho = {rho!r}: "
              f"{keep_threshold(rho)} (expected {want})")
    for spec, batch, heads, seq_q, seq_k, seed, want in SELFTEST_MASKS:
        shape, bits = make_mask(parse_sparsity(spec), batch, heads, seq_q, seq_k, seed)
        got = "".join(map(str, bits))
        ok = got == want
        failed += not ok
        density = sum(bits) / len(bits)
        print(f"{'ok  ' if ok else 'FAIL'} {spec} seed {seed} [{', '.join(map(str, shape))}] "
              f"(seq {seq_q}x{seq_k}): {got}  density {density:.6g}")
        if not ok:
            print(f"     expected {want}")
    print(f"selftest: {'all passed' if not failed else f'{failed} FAILED'}")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Results CSV


def default_commit():
    """$LADDER_COMMIT, else the driver's rule (tools/ladder.cpp, source_commit): `git rev-parse
    --short HEAD`, with -dirty when tracked files have uncommitted changes, else '-'."""
    env = os.environ.get("LADDER_COMMIT", "").strip()
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            # --no-optional-locks: a status killed mid-refresh must not leave index.lock behind
            changes = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain",
                                      "--untracked-files=no"],
                                     cwd=ROOT, text=True, capture_output=True, timeout=30)
            dirty = changes.returncode == 0 and changes.stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "-"


def fresh_run_id():
    """The UTC time and 24 random bits, as the driver's: two invocations, even within one
    second, share one with odds of 1 in 2^24."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


class ResultsCsv:
    """Adds rows of the results schema to a results file, each as soon as it is measured, by one
    locked read-merge-write (tools/pathargs.py merge_csv: under an flock of the file's folder,
    the file as it is now plus the row, renamed over it), so that a run cut short leaves only
    whole rows and two writers at once (another peers.py, `ladder bench --csv`) lose none of
    each other's. The path is checked when the object is made, before anything is measured: an
    empty path, a link, a FIFO, a device or a folder is refused, and so is an existing file with
    another header. A new or empty file gets the header with the first row."""

    def __init__(self, path):
        self.path, self.rows, self.new, self.p = path, 0, None, None
        if path is None:
            return
        self.p = pathargs.output_file(path, "--csv")
        if self.p.exists() and self.p.stat().st_size > 0:
            self.check_header(pathargs.read_text(self.p, "--csv").split("\n", 1)[0].rstrip("\r"))

    def check_header(self, first):
        if first == COLUMNS_BEFORE_RUN:
            raise pathargs.PathError(
                f"--csv {self.path} has the results schema from before the run column; migrate "
                f"it once with tools/migrate_results.py {self.path} (its rows get run = "
                "commit:<their commit>), then append")
        if first != COLUMNS:
            raise pathargs.PathError(f"--csv {self.path} starts with\n  {first}\nnot the results "
                                     f"schema\n  {COLUMNS}\n(give a new file or one of this "
                                     "schema)")

    def add(self, fields):
        if not self.p:
            return
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(fields)
        self.p.parent.mkdir(parents=True, exist_ok=True)
        new = pathargs.merge_csv(self.p, "--csv", COLUMNS, [buf.getvalue()], self.check_header)
        if self.new is None:
            self.new = new
        self.rows += 1

    def close(self):
        if not self.p:
            return
        if not self.rows:
            print(f"peers: no row measured; {self.path} left as it was")
        else:
            print(f"peers: {'wrote' if self.new else 'appended'} {self.rows} rows to {self.path}")


# ---------------------------------------------------------------------------------------------
# Everything below needs torch; imported in main() so that --help and --selftest work without.

torch = F = None
DEVICE = "cuda"  # every tensor's device (a test may point it elsewhere)
TOLERANCE = {  # max |x - ref| / max |ref| over the checked slice: (output, gradients)
    "fp32": (2e-3, 5e-3),
    "fp16": (4e-3, 1e-2),
    "bf16": (2e-2, 5e-2),
}
DTYPES = ("fp32", "fp16", "bf16")


class Unsupported(Exception):
    """The backend does not run this configuration (a skip, not a failure)."""


class CheckFailed(Exception):
    """The backend ran but its result is wrong (a failure: reported, nothing timed)."""


def torch_dtype(name):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def reference(q, k, v, do, scale, causal, keep, want_grads, want_var):
    """Attention of one head in float64: q, do [M, d]; k, v [N, d]; keep: [nI, nJ] bool block
    mask or None. Returns dict O (and dQ, dK, dV; and var_O, var_dV: the sums of P^2 V^2 and
    P^2 dO^2 that dropout's variance is made of), in query-row chunks to bound memory."""
    q, k, v = q.double(), k.double(), v.double()
    do = do.double() if do is not None else None
    m_len, n_len = q.shape[0], k.shape[0]
    out = {"O": torch.empty_like(q)}
    if want_grads:
        out.update(dQ=torch.empty_like(q), dK=torch.zeros_like(k), dV=torch.zeros_like(v))
    if want_var:
        out["var_O"] = torch.empty_like(q)
        if want_grads:
            out["var_dV"] = torch.zeros_like(v)
    cols = torch.arange(n_len, device=q.device)
    chunk = max(1, min(m_len, (1 << 24) // n_len))
    for r0 in range(0, m_len, chunk):
        r1 = min(m_len, r0 + chunk)
        rows = torch.arange(r0, r1, device=q.device)
        s = (q[r0:r1] @ k.T) * scale
        visible = torch.ones_like(s, dtype=torch.bool)
        if causal:
            visible &= cols[None, :] <= rows[:, None] + (n_len - m_len)
        if keep is not None:
            visible &= keep[(rows // MASK_BLOCK)[:, None], (cols // MASK_BLOCK)[None, :]]
        s = s.masked_fill(~visible, -math.inf)
        m = s.amax(dim=1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        l = p.sum(dim=1, keepdim=True)
        p = p / torch.where(l > 0, l, torch.ones_like(l))  # a row with no visible key: P = 0
        o = p @ v
        out["O"][r0:r1] = o
        if want_var:
            out["var_O"][r0:r1] = (p * p) @ (v * v)
        if want_grads:
            g = do[r0:r1]
            dp = g @ v.T
            ds = p * (dp - (g * o).sum(dim=1, keepdim=True))
            out["dQ"][r0:r1] = scale * (ds @ k)
            out["dK"] += scale * (ds.T @ q[r0:r1])
            out["dV"] += p.T @ g
            if want_var:
                out["var_dV"] += (p * p).T @ (g * g)
    return out


def first_line(e, limit=160):
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else repr(e)


def rel_err(x, ref):
    x = x.double()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def dropout_stats(x, ref, var_sum, p):
    """How x, computed with dropout at rate p, deviates from the no-dropout ref: (ratio, slope).
    Dropout at rate p with 1/(1-p) scaling leaves each element unbiased with variance
    var = p/(1-p) * var_sum. ratio: the mean of deviation^2 / var, near 1. slope: the deviation
    regressed on ref, near 0 (near -p without the scaling). Both weigh each element by 1 / var,
    so that the few rows with large variance (the first rows of a causal mask, with few keys)
    do not decide the result alone."""
    x = x.double()
    if not torch.isfinite(x).all():
        return math.inf, math.inf
    var = (p / (1 - p)) * var_sum
    valid = var > 1e-30 * var.max().clamp_min(1e-300)  # rows without a visible key: no spread
    dev, ref, var = (x - ref)[valid], ref[valid], var[valid]
    ratio = ((dev * dev) / var).mean().item()
    slope = ((dev * ref / var).sum() / (ref * ref / var).sum().clamp_min(1e-300)).item()
    return ratio, slope


class Config:
    """One measured point: the shape, the options and the peer."""

    def __init__(self, backend, dtype, batch, heads, seq, dim, causal, dropout, spec, mask):
        self.backend, self.dtype, self.batch, self.heads = backend, dtype, batch, heads
        self.seq, self.dim, self.causal, self.dropout, self.spec = seq, dim, causal, dropout, spec
        self.mask = mask  # (shape, bits) or None
        self.density = 1.0 if mask is None else sum(mask[1]) / len(mask[1])

    @property
    def step(self):
        return f"torch-{self.backend}"

    def label(self):
        extra = "".join([f" dropout {self.dropout:g}" if self.dropout else "",
                         f" {spec_name(self.spec)}" if self.mask else ""])
        return (f"{self.step:15} {self.dtype} B={self.batch} H={self.heads} N={self.seq} "
                f"d={self.dim} {'causal' if self.causal else 'not causal'}{extra}")

    def fwd_flops(self):
        f = 4.0 * self.batch * self.heads * self.seq * self.seq * self.dim
        return (f / 2 if self.causal else f) * self.density

    def bytes(self, direction):
        elem = 4 if self.dtype == "fp32" else 2
        tensors = 4 if direction == "fwd" else 8  # q, k, v, o (+ do, dq, dk, dv)
        return tensors * self.batch * self.heads * self.seq * self.dim * elem


class Peer:
    """Runs one configuration: the callable, its check and its timings."""

    def __init__(self, cfg, inputs, flex_cache):
        self.cfg, self.q, self.k, self.v, self.do = cfg, *inputs
        try:
            self.fn = self.build(flex_cache)
        except CheckFailed:
            raise
        except Exception as e:  # building a mask is this script's job: a failure is a bug
            raise CheckFailed(f"could not set up: {type(e).__name__}: {first_line(e)}")

    def build(self, flex_cache):
        c = self.cfg
        if c.backend == "flex":
            return self.build_flex(flex_cache)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[c.backend]

        def run():
            with sdpa_kernel(backend):  # only this backend: no silent fallback to another
                return F.scaled_dot_product_attention(self.q, self.k, self.v,
                                                      dropout_p=c.dropout, is_causal=c.causal)
        return run

    def build_flex(self, cache):
        from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
        c = self.cfg
        m_len = n_len = c.seq
        if "causal_mod" not in cache:  # one function object per shape: Dynamo guards on it
            offset = n_len - m_len

            def causal_mod(b, h, q_idx, kv_idx):  # bottom-right aligned, as the contract's
                return kv_idx <= q_idx + offset

            cache["causal_mod"] = causal_mod
        causal_mod = cache["causal_mod"]
        if c.mask is not None:
            block_mask = self.flex_block_mask(BlockMask, causal_mod if c.causal else None)
        elif c.causal:
            block_mask = create_block_mask(causal_mod, None, None, m_len, n_len, device=DEVICE,
                                           BLOCK_SIZE=MASK_BLOCK)
        else:
            block_mask = None
        # One compiled function per shape (the cache is cleared between shapes): compiling is
        # part of the first, untimed call.
        if "flex" not in cache:
            cache["flex"] = torch.compile(flex_attention, dynamic=False)
        compiled = cache["flex"]
        return lambda: compiled(self.q, self.k, self.v, block_mask=block_mask)

    def flex_block_mask(self, BlockMask, mask_mod):
        """The ladder's block mask as a FlexAttention BlockMask: per query block, the kept key
        blocks, split into full ones (every element visible: no mask_mod needed) and partial ones
        (the causal diagonal, a tail block); kept blocks that causality hides entirely are left
        out: they contribute nothing."""
        c = self.cfg
        (bm, hm, n_i, n_j), bits = c.mask
        m_len = n_len = c.seq
        dev = DEVICE
        keep = torch.tensor(bits, dtype=torch.bool, device=dev).view(bm, hm, n_i, n_j)
        i0 = torch.arange(n_i, device=dev)[:, None] * MASK_BLOCK  # first query row of block I
        i1 = torch.clamp(i0 + MASK_BLOCK, max=m_len) - 1           # last query row
        j0 = torch.arange(n_j, device=dev)[None, :] * MASK_BLOCK
        j1 = torch.clamp(j0 + MASK_BLOCK, max=n_len) - 1
        if c.causal:
            any_visible = j0 <= i1 + (n_len - m_len)
            all_visible = j1 <= i0 + (n_len - m_len)
        else:
            any_visible = torch.ones(n_i, n_j, dtype=torch.bool, device=dev)
            all_visible = any_visible.clone()
        whole = ((i0 + MASK_BLOCK <= m_len) & (j0 + MASK_BLOCK <= n_len))
        full = keep & (all_visible & whole)
        partial = keep & any_visible & ~(all_visible & whole)

        def ordered(dense):  # (count per row, kept column indices first, ascending)
            d32 = dense.to(torch.int32)
            return (d32.sum(dim=-1).to(torch.int32).contiguous(),
                    torch.argsort(d32, dim=-1, descending=True, stable=True).to(torch.int32)
                    .contiguous())

        kv_num, kv_idx = ordered(partial)
        full_num, full_idx = ordered(full)
        extra = {}
        if "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters:
            extra["seq_lengths"] = (m_len, n_len)  # else taken as nI * 128, nJ * 128
        bmask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx,
                                         BLOCK_SIZE=MASK_BLOCK, mask_mod=mask_mod, **extra)
        # The BlockMask must hold exactly the blocks we meant (its own view, back to dense).
        dense = bmask.to_dense().to(torch.bool)
        if not torch.equal(dense.expand(bm, hm, n_i, n_j), (full | partial)):
            raise CheckFailed("the BlockMask built from the ladder's mask has other blocks")
        return bmask

    def forward(self):
        return self.fn()

    def keep_blocks(self, b, h):
        if self.cfg.mask is None:
            return None
        (bm, hm, n_i, n_j), bits = self.cfg.mask
        keep = torch.tensor(bits, dtype=torch.bool, device=DEVICE).view(bm, hm, n_i, n_j)
        return keep[0 if bm == 1 else b, 0 if hm == 1 else h]

    def check(self, directions, ref_cache):
        """Runs the configuration once on its full inputs and compares batch 0, two heads, with
        float64 (see the module's docstring). Raises Unsupported or CheckFailed."""
        c = self.cfg
        want_grads = "bwd" in directions
        for t in (self.q, self.k, self.v):
            t.grad = None
        try:
            out = self.forward()
            if want_grads:
                out.backward(self.do)
            torch.cuda.synchronize()
        except CheckFailed:
            raise
        except torch.cuda.OutOfMemoryError:
            raise Unsupported("out of memory")
        except Exception as e:  # e.g. "No available kernel", an unsupported dtype or head dim
            raise Unsupported(f"{type(e).__name__}: {first_line(e)}")
        tol_out, tol_grad = TOLERANCE[c.dtype]
        scale = 1.0 / math.sqrt(c.dim)
        worst = {}  # per output, the value of the head farthest from the ideal, as text
        for h in sorted({0, c.heads - 1}):
            key = (h, c.causal, spec_name(c.spec), want_grads, bool(c.dropout))
            if key not in ref_cache:
                ref_cache[key] = reference(self.q[0, h].detach(), self.k[0, h].detach(),
                                           self.v[0, h].detach(), self.do[0, h], scale, c.causal,
                                           self.keep_blocks(0, h), want_grads, bool(c.dropout))
            ref = ref_cache[key]
            got = {"O": out[0, h].detach()}
            if want_grads:
                got.update(dQ=self.q.grad[0, h], dK=self.k.grad[0, h], dV=self.v.grad[0, h])
            if c.dropout:
                # O and dV: the deviation dropout must cause, unbiased; dQ, dK: finite.
                checks = [("O", dropout_stats(got["O"], ref["O"], ref["var_O"], c.dropout))]
                if want_grads:
                    checks.append(("dV", dropout_stats(got["dV"], ref["dV"], ref["var_dV"],
                                                       c.dropout)))
                    for name in ("dQ", "dK"):
                        if not torch.isfinite(got[name]).all():
                            raise CheckFailed(f"head {h}: {name} is not finite")
                for name, (ratio, slope) in checks:
                    far = abs(math.log(max(ratio, 1e-300)))
                    if name not in worst or far > abs(math.log(max(worst[name][0], 1e-300))):
                        worst[name] = (ratio, f"{name} {ratio:.2f} (bias {slope:+.3f})")
                    if not 0.75 <= ratio <= 1.33:
                        raise CheckFailed(f"head {h}: {name} deviates from the no-dropout result "
                                          f"{ratio:.3g}x as much as dropout p = {c.dropout:g} "
                                          "would (expected 0.75..1.33)")
                    if not abs(slope) <= c.dropout / 2:
                        raise CheckFailed(f"head {h}: {name} is biased by {slope:+.3g} x the "
                                          f"no-dropout result (expected 0; -{c.dropout:g} "
                                          "without the 1/(1-p) scaling)")
                continue
            for name, x in got.items():
                err, tol = rel_err(x, ref[name]), tol_out if name == "O" else tol_grad
                if name not in worst or err > worst[name][0]:
                    worst[name] = (err, f"{name} {err:.1e}")
                if not err <= tol:
                    raise CheckFailed(f"head {h}: {name} error {err:.3g} (max |x - ref| / max "
                                      f"|ref| vs float64) > {tol:g}")
        del out
        return ("dropout spread / expected: " if c.dropout else "rel. error: ") + ", ".join(
            text for _, text in worst.values())

    def time(self, direction, repeats, warmup, flush):
        """Median ms of one call: the forward, or out.backward(dO) on a fresh forward."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for i in range(warmup + repeats):
            if direction == "bwd":
                for t in (self.q, self.k, self.v):
                    t.grad = None
                out = self.forward()
            flush.zero_()  # the L2 holds nothing of the inputs when the timed call starts
            start.record()
            if direction == "fwd":
                out = self.forward()
            else:
                out.backward(self.do)
            end.record()
            end.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
            del out
        times.sort()
        return times[len(times) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=DTYPES)
    ap.add_argument("--dims", nargs="+", type=int, default=[64, 128])
    ap.add_argument("--seqlens", nargs="+", type=int,
                    default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    ap.add_argument("--backends", nargs="+", default=["flash", "cudnn", "efficient", "math"],
                    choices=BACKENDS, help="default: the four SDPA backends; add flex for "
                    "FlexAttention (compiling it takes a while per shape)")
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--dropout", nargs="+", type=float, default=[0.0], metavar="P",
                    help="dropout rates in [0, 1) (SDPA backends only; default 0)")
    ap.add_argument("--block-sparsity", nargs="+", type=parse_sparsity, default=[("dense", None)],
                    metavar="SPEC", help="dense, random:RHO or local:W (mask block 128; "
                    "FlexAttention only; default dense)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the inputs and of random:RHO masks (default 0)")
    ap.add_argument("--tokens", type=int, default=16384, help="B*N (default 16384)")
    ap.add_argument("--hidden", type=int, default=2048, help="H*d (default 2048)")
    ap.add_argument("--repeats", type=int, default=20,
                    help="timed calls, median reported (default 20; >= 20 with --csv)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    ap.add_argument("--csv", metavar="FILE", help="append rows of the results schema to FILE")
    ap.add_argument("--commit", help="the commit column (default $LADDER_COMMIT, else git "
                    "rev-parse --short HEAD, with -dirty for uncommitted changes, else -)")
    ap.add_argument("--run-id", help="the run column (default: a fresh id per invocation); "
                    "tools/gpu_check.sh gives its sweep and its peers one id")
    ap.add_argument("--selftest", action="store_true",
                    help="check the block-mask generator against known values and exit")
    args = ap.parse_args(argv)
    if args.selftest:
        return selftest()
    if any(not 0.0 <= p < 1.0 for p in args.dropout):
        ap.error("--dropout P needs 0 <= P < 1")
    if args.repeats < 1 or args.warmup < 0 or (args.csv and args.repeats < MIN_CSV_REPEATS):
        ap.error(f"--repeats must be >= 1 (>= {MIN_CSV_REPEATS} for rows written with --csv)")
    if any(n < 1 for n in args.seqlens + args.dims) or args.tokens < 1 or args.hidden < 1:
        ap.error("--seqlens, --dims, --tokens and --hidden must be positive")
    if not 0 <= args.seed < 2**64:
        ap.error("--seed must be in [0, 2^64)")
    if args.run_id is not None and not RUN_ID.fullmatch(args.run_id):
        ap.error("--run-id must be 1 to 64 of A-Z a-z 0-9 . _ : + -")
    try:
        # The --csv target before the device: a bad path is exit 2 on any machine.
        results = ResultsCsv(args.csv)
    except pathargs.PathError as e:
        print(f"peers: error: {e}", file=sys.stderr)
        return 2
    try:
        return measure(args, results)
    except pathargs.PathError as e:  # the results file changed under the run (a link, ...)
        print(f"peers: error: {e}; rows measured so far: {results.rows}", file=sys.stderr)
        return 2


def measure(args, results):
    """Everything that needs torch and the device: the sweep, its rows into `results`."""
    global torch, F
    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError as e:
        print(f"peers: PyTorch is not installed here ({e}); nothing measured", file=sys.stderr)
        return 3
    torch, F = _torch, _F
    if not torch.cuda.is_available():
        print("peers: no CUDA device visible to PyTorch; nothing measured", file=sys.stderr)
        return 3
    commit = args.commit or default_commit()
    run_id = args.run_id or fresh_run_id()
    gpu, cuda = torch.cuda.get_device_name(), torch.version.cuda or "-"
    if args.repeats < MIN_CSV_REPEATS:
        print(f"peers: median of {args.repeats} (the contract's convention is >= "
              f"{MIN_CSV_REPEATS})")
    print(f"# {gpu}, torch {torch.__version__}, CUDA {cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, commit {commit}, run {run_id}", flush=True)
    import warnings
    warnings.filterwarnings("ignore")  # SDPA explains every backend it skips, at length
    if "flex" in args.backends:
        # Every shape compiles its own kernels: keep Dynamo from falling back to eager mode.
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 4096)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=DEVICE)

    header = (f"{'step':15} {'dtype':5} {'B':>3} {'H':>3} {'N':>6} {'d':>4} {'causal':>6} "
              f"{'dir':3} {'dropout':>7} {'density':>7} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>8}")
    print(header, flush=True)
    skipped_notes, failed = set(), 0
    for dtype in args.dtypes:
        for dim in args.dims:
            for seq in args.seqlens:
                batch, heads = max(1, args.tokens // seq), max(1, args.hidden // dim)
                torch.manual_seed(args.seed)
                shape = (batch, heads, seq, dim)
                dt = torch_dtype(dtype)
                q, k, v, do = (torch.randn(shape, device=DEVICE).to(dt) for _ in range(4))
                for t in (q, k, v):
                    t.requires_grad_(True)
                flex_cache, ref_cache = {}, {}
                masks = {}
                for causal in args.causal:
                    ref_cache.clear()
                    for spec in args.block_sparsity:
                        key = spec_name(spec)
                        if key not in masks:
                            masks[key] = make_mask(spec, batch, heads, seq, seq, args.seed)
                        for p in args.dropout:
                            for backend in args.backends:
                                cfg = Config(backend, dtype, batch, heads, seq, dim, bool(causal),
                                             p, spec, masks[key])
                                failed += run_config(cfg, (q, k, v, do), args, flex_cache,
                                                     ref_cache, flush, results, gpu, cuda,
                                                     (commit, run_id), skipped_notes)
                del q, k, v, do, flex_cache, ref_cache
                if "flex" in args.backends:
                    torch._dynamo.reset()  # compiled kernels of this shape are not needed again
                torch.cuda.empty_cache()
    results.close()
    if failed:
        print(f"peers: {failed} configuration(s) failed their check (nothing timed for them)")
    return 1 if failed else 0


def run_config(cfg, inputs, args, flex_cache, ref_cache, flush, results, gpu, cuda, stamp,
               skipped_notes):
    """Checks, times and reports one configuration; returns 1 if its check failed. stamp:
    (commit, run id), written into the commit and run columns of its rows."""
    commit, run_id = stamp
    def skip(why, once=False):
        if once:
            if why in skipped_notes:
                return 0
            skipped_notes.add(why)
        print(f"skip {cfg.label()}: {why}", flush=True)
        return 0

    if cfg.mask is not None and cfg.backend != "flex":
        return skip(f"{cfg.step} has no block-sparse kernel (block-sparse runs on torch-flex)",
                    once=True)
    if cfg.dropout and cfg.backend == "flex":
        return skip("FlexAttention has no dropout", once=True)
    if cfg.backend == "math":
        # An estimate of what the math backend holds at once in the backward: four fp32
        # B*H*N*N matrices (scores, probabilities and their gradients).
        need = 4 * 4 * cfg.batch * cfg.heads * cfg.seq * cfg.seq
        free = torch.cuda.mem_get_info()[0]
        if need > 0.8 * free:
            return skip(f"math materialises B*H*N*N scores: ~{need / 2**30:.0f} GiB, "
                        f"{free / 2**30:.0f} GiB free")
    try:
        peer = Peer(cfg, inputs, flex_cache)
        summary = peer.check(args.directions, ref_cache)
    except Unsupported as e:
        torch.cuda.empty_cache()  # what a failed attempt (out of memory) left behind
        return skip(f"not supported: {e}")
    except CheckFailed as e:
        print(f"FAIL {cfg.label()}: {e}", flush=True)
        return 1
    heads = " and ".join(str(h) for h in sorted({0, cfg.heads - 1}))
    print(f"ok   {cfg.label()}: checked vs float64 (batch 0, head {heads}), {summary}",
          flush=True)
    for direction in args.directions:
        try:
            ms = peer.time(direction, args.repeats, args.warmup, flush)
        except Exception as e:  # noqa: BLE001 (a timing failure skips the point, never the run)
            skip(f"{direction} could not be timed: {type(e).__name__}: {first_line(e)}")
            continue
        flops = cfg.fwd_flops() * (2.5 if direction == "bwd" else 1.0)
        tflops = flops / (ms * 1e9)
        gbps = cfg.bytes(direction) / (ms * 1e6)
        print(f"{cfg.step:15} {cfg.dtype:5} {cfg.batch:>3} {cfg.heads:>3} {cfg.seq:>6} "
              f"{cfg.dim:>4} {int(cfg.causal):>6} {direction:3} {cfg.dropout:>7g} "
              f"{cfg.density:>7.4g} {ms:>9.4f} {tflops:>8.1f} {gbps:>8.1f}", flush=True)
        results.add([cfg.step, cfg.dtype, cfg.batch, cfg.heads, cfg.heads, cfg.seq, cfg.seq,
                      cfg.dim, int(cfg.causal), direction, f"{ms:.6f}", f"{tflops:.3f}",
                      f"{gbps:.3f}", 0, gpu, cuda, commit, f"{cfg.dropout:g}",
                      f"{cfg.density:.6g}", run_id])
    return 0


if __name__ == "__main__":
    sys.exit(main())
