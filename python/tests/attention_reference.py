"""What the tests compare against: PyTorch's SDPA under the ladder's contract, and the contract's
dropout and the harness's yardstick written out here for what SDPA cannot take.

Two differences from SDPA's defaults are bridged here, not in the operator: the causal mask is
bottom-right aligned (key j visible to query i iff j <= i + N - M; SDPA's is_causal is
top-left, the same only when M == N), and a query row that sees no key gives O = 0 and zero
gradients (SDPA gives NaN). GQA: K and V heads are repeated for SDPA, whose gradients autograd
then sums back over each group, which is what the rungs' dK and dV hold. A block mask reaches
SDPA as the equivalent dense attn_mask. Dropout's mask Z cannot be given to SDPA: dropout_keep
computes it from the contract's definition (Philox4x32-10, docs/CONTRACT.md), and plain() is
attention with it, the harness's yardstick (reference/plain.cpp) in torch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

UNIT_ROUNDOFF = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
}


def visible(m: int, n: int, causal: bool, device) -> torch.Tensor:
    """[M, N] bool: which keys each query sees."""
    if not causal:
        return torch.ones(m, n, dtype=torch.bool, device=device)
    i = torch.arange(m, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    return j <= i + (n - m)


def blocks_to_dense(block_mask: torch.Tensor, m: int, n: int, mask_block) -> torch.Tensor:
    """[Bm, Hm, ceil(M / bm), ceil(N / bn)] block mask -> [Bm, Hm, M, N] bool: key j visible to
    query i by the mask alone."""
    bm, bn = (mask_block, mask_block) if isinstance(mask_block, int) else mask_block
    rows = block_mask.repeat_interleave(bm, dim=2)[:, :, :m]
    return rows.repeat_interleave(bn, dim=3)[:, :, :, :n]


def sdpa(q, k, v, causal: bool, scale: float | None, keep: torch.Tensor | None = None):
    """SDPA in q's dtype, under the contract (see the module's docstring); keep: a dense mask
    [Bm, Hm, M, N] (blocks_to_dense) besides the causal one."""
    m, n = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k2 = k.repeat_interleave(group, dim=1)
    v2 = v.repeat_interleave(group, dim=1)
    mask = visible(m, n, causal, q.device)
    if keep is not None:
        mask = mask & keep.to(q.device)
    rows = mask.any(dim=-1)  # queries that see at least one key
    mask = mask | ~rows[..., None]  # give empty rows every key, then zero them below
    masked = causal or keep is not None
    out = F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask if masked else None, scale=scale)
    return out * rows[..., None].to(out.dtype)


def lse(q, k, causal: bool, scale: float | None, keep: torch.Tensor | None = None):
    """log sum_j exp(S_ij) over the visible keys, in float64; -inf where none."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    s = scale * q.double() @ k.double().repeat_interleave(group, dim=1).transpose(-1, -2)
    mask = visible(q.shape[2], k.shape[2], causal, q.device)
    if keep is not None:
        mask = mask & keep.to(q.device)
    return torch.logsumexp(s.masked_fill(~mask, -math.inf), dim=-1)


def seed_after(s: int) -> int:
    """The dropout seed attention() draws right after torch.manual_seed(s): one int64 below
    2^63 - 1 from the default CPU generator (ops.py)."""
    torch.manual_seed(s)
    return int(torch.randint(2**63 - 1, (1,), dtype=torch.int64))


_MASK32 = 0xFFFFFFFF


def _mul_hi_lo(a: int, x: torch.Tensor):
    """The high and low 32-bit words of a * x, for a constant a and int64 x below 2^32: the
    product in 16-bit halves, so that nothing leaves int64."""
    t0, t1 = (a & 0xFFFF) * x, (a >> 16) * x  # each below 2^48
    low = t0 + ((t1 & 0xFFFF) << 16)
    return (t1 >> 16) + (low >> 32), low & _MASK32


def dropout_keep(seed: int, p: float, b: int, h: int, m: int, n: int) -> torch.Tensor:
    """Dropout's Z, bool [b, h, m, n] (True: kept), from its definition in docs/CONTRACT.md:
    for (b, h, i, j) with I = i / 16, r = i % 16, J = j / 32, e = (j / 16) % 2, c = j % 16,
    lane = (r % 8) * 4 + (c % 8) / 2, byte e of the 16-bit half k = (r / 8) * 4 + (c / 8) * 2 +
    c % 2 of Philox4x32-10(counter (32 J + lane, I, h, b), key (seed lo, seed hi)), kept iff it
    is >= min(255, round(p 2^8)). Written here in int64 tensor arithmetic, apart from the
    library's C++ (common/dropout.hpp)."""
    i = torch.arange(m).view(1, 1, m, 1)
    j = torch.arange(n).view(1, 1, 1, n)
    r, c = i & 15, j & 15
    shape = (b, h, m, n)
    c0 = ((j >> 5) * 32 + (r & 7) * 4 + ((c & 7) >> 1)).expand(shape)
    c1 = (i >> 4).expand(shape)
    c2 = torch.arange(h).view(1, h, 1, 1).expand(shape)
    c3 = torch.arange(b).view(b, 1, 1, 1).expand(shape)
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    for _ in range(10):
        hi0, lo0 = _mul_hi_lo(0xD2511F53, c0)
        hi1, lo1 = _mul_hi_lo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & _MASK32, (k1 + 0xBB67AE85) & _MASK32
    slot = ((r >> 3) * 4 + (c >> 3) * 2 + (c & 1)).expand(shape)
    e = ((j >> 4) & 1).expand(shape)
    words = torch.stack([c0, c1, c2, c3], dim=-1)
    word = torch.gather(words, -1, (slot >> 1).unsqueeze(-1)).squeeze(-1)
    u = (word >> (16 * (slot & 1) + 8 * e)) & 0xFF
    return u >= min(255, int(p * 256.0 + 0.5))


def plain(q, k, v, dout, causal, scale, keep=None, z=None, p=0.0):
    """Attention as the harness's yardstick computes it (reference/plain.cpp), vectorised: S, its
    max, sum and LSE in float32 (float64 for float64 inputs), the weights exp(S - m) rounded to
    q's dtype before they multiply V, O rounded once; the backward as FlashAttention-2's, P and
    dS rounded to the dtype as the operands of the products, the gradients rounded once. For
    float64 inputs nothing is rounded: the exact result. keep: dense mask [Bm, Hm, M, N]; z:
    dropout's Z [B, H, M, N] at rate p. Returns out, dq, dk, dv (the last three None without
    dout)."""
    dt = q.dtype
    f = torch.float64 if dt == torch.float64 else torch.float32

    def rnd(x):
        return x.to(dt).to(f)

    m, n, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    Q = q.detach().to(f)
    K = k.detach().to(f).repeat_interleave(group, dim=1)
    V = v.detach().to(f).repeat_interleave(group, dim=1)
    vis = visible(m, n, causal, q.device)
    if keep is not None:
        vis = vis & keep.to(q.device)
    vis = vis.expand(q.shape[0], q.shape[1], m, n)
    zf = torch.ones_like(vis, dtype=f) if z is None else z.to(q.device, f)
    inv_keep = 1.0 / (1.0 - p) if z is not None else 1.0
    S = (scale * Q @ K.transpose(-1, -2)).masked_fill(~vis, -math.inf)
    mx = S.amax(dim=-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    E = torch.exp(S - mx)  # 0 where not visible
    l = E.sum(dim=-1, keepdim=True)
    norm = torch.where(l == 0, torch.zeros_like(l), inv_keep / l.clamp_min(1e-300))
    O = rnd((rnd(E) * zf) @ V * norm)
    if dout is None:
        return O.to(dt), None, None, None
    lse = torch.where(l == 0, torch.full_like(l, -math.inf), mx + torch.log(l))
    G = dout.detach().to(f)
    D = (G * O).sum(dim=-1, keepdim=True)
    P = torch.where(vis, torch.exp(S - torch.where(l == 0, torch.zeros_like(l), lse)), 0.0)
    dP = (G @ V.transpose(-1, -2)) * zf * inv_keep
    dS = rnd(torch.where(vis, P * (dP - D), 0.0))
    PZ = rnd(P * inv_keep) * zf
    b, hkv = k.shape[0], k.shape[1]
    dq = rnd(scale * dS @ K)
    dk = (scale * dS.transpose(-1, -2) @ Q).view(b, hkv, group, n, -1).sum(dim=2)
    dv = (PZ.transpose(-1, -2) @ G).view(b, hkv, group, n, -1).sum(dim=2)
    return O.to(dt), dq.to(dt), rnd(dk).to(dt), rnd(dv).to(dt)


def inputs(b, h, hkv, m, n, d, dtype, device, seed=0, requires_grad=True):
    """q, k, v, dO drawn N(0, 1) in float32 and rounded to dtype, so that their float64 copies
    are exactly what the rung sees."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, h, m, d), (b, hkv, n, d), (b, hkv, n, d), (b, h, m, d)]
    ts = [torch.randn(s, generator=gen).to(dtype).to(device) for s in shapes]
    for t in ts[:3]:
        t.requires_grad_(requires_grad)
    return ts


def forward_backward(fn, q, k, v, dout):
    """fn(q, k, v) -> out; returns out and the gradients for dO, detached."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
