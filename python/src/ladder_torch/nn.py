"""Modules around attention(): a drop-in for a call to scaled_dot_product_attention, and a
causal self-attention layer with the usual fused projection."""

from __future__ import annotations

import torch

from .ops import attention


class ScaledDotProductAttention(torch.nn.Module):
    """forward(q, k, v) = attention(q, k, v, causal=..., scale=..., rung=...): where a model
    calls F.scaled_dot_product_attention(q, k, v, is_causal=True), this module (causal=True) takes
    its place. dropout_p applies in training mode only, as nn.MultiheadAttention's does (and,
    being unsupported by the operator yet, raises there when non-zero)."""

    def __init__(self, causal=False, scale=None, dropout_p=0.0, rung=None):
        super().__init__()
        self.causal, self.scale, self.dropout_p, self.rung = causal, scale, dropout_p, rung

    def forward(self, q, k, v):
        p = self.dropout_p if self.training else 0.0
        return attention(q, k, v, dropout_p=p, causal=self.causal, scale=self.scale, rung=self.rung)

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, scale={self.scale}, dropout_p={self.dropout_p}, "
            f"rung={self.rung}"
        )


class CausalSelfAttention(torch.nn.Module):
    """x [B, T, C] -> [B, T, C]: one fused q/k/v projection, heads of C / heads, causal
    attention through the rung, an output projection. q, k and v are views of the projection
    ([B, T, 3, H, d] seen as [B, H, T, d]); attention() takes any strides."""

    def __init__(self, d_model: int, heads: int, rung=None, bias=False, device=None, dtype=None):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"ladder: d_model {d_model} is not a multiple of heads {heads}")
        self.heads, self.rung = heads, rung
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, **kw)
        self.proj = torch.nn.Linear(d_model, d_model, **kw)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = attention(q, k, v, causal=True, rung=self.rung)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))
