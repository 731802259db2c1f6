"""Modules around attention(): a drop-in for a call to scaled_dot_product_attention, and a
causal self-attention layer with the usual fused projection."""

from __future__ import annotations

import torch

from .ops import attention


class ScaledDotProductAttention(torch.nn.Module):
    """forward(q, k, v, block_mask=None) = attention(q, k, v, causal=..., scale=..., rung=...):
    where a model calls F.scaled_dot_product_attention(q, k, v, is_causal=True), this module
    (causal=True) takes its place. dropout_p applies in training mode only, as
    nn.MultiheadAttention's does; a block mask is per call, of mask_block blocks."""

    def __init__(self, causal=False, scale=None, dropout_p=0.0, rung=None, mask_block=128):
        super().__init__()
        self.causal, self.scale, self.dropout_p, self.rung = causal, scale, dropout_p, rung
        self.mask_block = mask_block

    def forward(self, q, k, v, block_mask=None):
        p = self.dropout_p if self.training else 0.0
        return attention(
            q,
            k,
            v,
            dropout_p=p,
            causal=self.causal,
            scale=self.scale,
            rung=self.rung,
            block_mask=block_mask,
            mask_block=self.mask_block,
        )

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, scale={self.scale}, dropout_p={self.dropout_p}, "
            f"rung={self.rung}, mask_block={self.mask_block}"
        )


class CausalSelfAttention(torch.nn.Module):
    """x [B, T, C] -> [B, T, C]: one fused q/k/v projection, heads of C / heads, causal
    attention through the rung (dropout_p on its weights in training mode), an output
    projection. q, k and v are views of the projection ([B, T, 3, H, d] seen as [B, H, T, d]):
    rung 07 reads them in place and returns y in [B, T, H, d] storage, so neither side is copied;
    the other rungs copy them."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        rung=None,
        bias=False,
        dropout_p=0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        for name, value in (("d_model", d_model), ("heads", heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ladder: {name} must be an int of at least 1, got {value!r}")
        if d_model % heads:
            raise ValueError(
                f"ladder: d_model ({d_model}) must be a multiple of heads ({heads}): each head "
                "gets d_model / heads of the model's width"
            )
        self.d_model = d_model
        self.heads, self.rung, self.dropout_p = heads, rung, dropout_p
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, **kw)
        self.proj = torch.nn.Linear(d_model, d_model, **kw)

    def forward(self, x):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.d_model:
            got = f"shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"ladder: CausalSelfAttention takes x [batch, seq, d_model] with d_model "
                f"{self.d_model}; got {got}"
            )
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        p = self.dropout_p if self.training else 0.0
        y = attention(q, k, v, dropout_p=p, causal=True, rung=self.rung)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))
