"""The ladder:: operators' schemas, fake implementations and autograd formula.

  ladder::fwd(q, k, v, causal, scale, rung, dropout_p, seed, block_mask, mask_block_q,
              mask_block_k) -> (out, lse, lse_lo)
  ladder::bwd(dout, q, k, v, out, lse, lse_lo, causal, scale, rung, dropout_p, seed, block_mask,
              mask_block_q, mask_block_k) -> (dq, dk, dv)

The real implementations are C++ (python/csrc: ops_cpu.cpp for rung 0, ops_cuda.cpp for the GPU
rungs), registered per dispatch key when _native loads their libraries, and so is the autograd
formula (ops_cpu.cpp, a C++ autograd function at the Autograd key for every device: the backward
calls ladder::bwd, the rung's own backward kernels, with the forward's dropout seed and block mask;
ladder::bwd's own autograd function makes it once differentiable, a second derivative raising
rather than coming back as zero). This module imports nothing from the package but the rungs'
table, so that the libraries' loader can import it first (schemas before kernels) without a cycle.
The fake implementations give torch.compile the outputs' shapes, dtypes and strides without running
anything. lse_lo is LSE's rounding residual, which rung 05's backward reads ([B, H, M] there, an
empty [0] for the other rungs).

Dropout (dropout_p > 0) needs seed: one int64 in a CPU tensor, the key of the contract's Philox
mask Z (read on the host, so a tensor argument costs no device synchronisation and lets
torch.compile trace its drawing into the graph). block_mask: bool [Bm, Hm, ceil(M / mask_block_q),
ceil(N / mask_block_k)], Bm 1 or B, Hm 1 or H, on q's device.
"""

from __future__ import annotations

import torch

from .rungs import rung as rung_row

_lib = torch.library.Library("ladder", "DEF")  # kept alive: the schemas live as long as it does
_FEATURES = (
    "float dropout_p=0.0, Tensor? seed=None, Tensor? block_mask=None, int mask_block_q=128, "
    "int mask_block_k=128"
)
_lib.define(
    f"fwd(Tensor q, Tensor k, Tensor v, bool causal, float scale, int rung, {_FEATURES}) "
    "-> (Tensor out, Tensor lse, Tensor lse_lo)"
)
_lib.define(
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor lse_lo, "
    f"bool causal, float scale, int rung, {_FEATURES}) -> (Tensor dq, Tensor dk, Tensor dv)"
)


def out_like(q: torch.Tensor, rung: int) -> torch.Tensor:
    """The operator's O, as ops_cuda.cpp's new_out allocates it: for a rung that writes through
    strides, [B, M, H, d] storage where q is a view of such ([B, H, M, d] with q.stride(1) <
    q.stride(2)), as SDPA's flash and cuDNN backends give; else dense."""
    b, h, m, d = q.shape
    if rung_row(rung).strides and q.stride(1) < q.stride(2):
        return q.new_empty((b, m, h, d)).transpose(1, 2)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.register_fake("ladder::fwd")
def _fwd_fake(q, k, v, causal, scale, rung, dropout_p=0.0, seed=None, block_mask=None,
              mask_block_q=128, mask_block_k=128):
    b, h, m, _ = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse_lo_shape = (b, h, m) if rung_row(rung).lse_lo else (0,)
    return (
        out_like(q, rung),
        q.new_empty((b, h, m), dtype=lse_dtype),
        q.new_empty(lse_lo_shape, dtype=torch.float32),
    )


@torch.library.register_fake("ladder::bwd")
def _bwd_fake(dout, q, k, v, out, lse, lse_lo, causal, scale, rung, dropout_p=0.0, seed=None,
              block_mask=None, mask_block_q=128, mask_block_k=128):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )
