"""What the tests compare against: PyTorch's SDPA under the ladder's contract.

Two differences from SDPA's defaults are bridged here, not in the operator: the causal mask is
bottom-right aligned (key j visible to query i iff j <= i + N - M; SDPA's is_causal is
top-left, the same only when M == N), and a query row that sees no key gives O = 0 and zero
gradients (SDPA gives NaN). GQA: K and V heads are repeated for SDPA, whose gradients autograd
then sums back over each group, which is what the rungs' dK and dV hold.
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


def sdpa(q, k, v, causal: bool, scale: float | None):
    """SDPA in q's dtype, under the contract (see the module's docstring)."""
    m, n = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    k2 = k.repeat_interleave(group, dim=1)
    v2 = v.repeat_interleave(group, dim=1)
    mask = visible(m, n, causal, q.device)
    rows = mask.any(dim=1)  # queries that see at least one key
    mask = mask | ~rows[:, None]  # give empty rows every key, then zero them below
    out = F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask if causal else None, scale=scale)
    return out * rows[:, None].to(out.dtype)


def lse(q, k, causal: bool, scale: float | None) -> torch.Tensor:
    """log sum_j exp(S_ij) over the visible keys, in float64; -inf where none."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    s = scale * q.double() @ k.double().repeat_interleave(group, dim=1).transpose(-1, -2)
    s = s.masked_fill(~visible(q.shape[2], k.shape[2], causal, q.device), -math.inf)
    return torch.logsumexp(s, dim=-1)


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
