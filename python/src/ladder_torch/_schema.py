"""The ladder:: operators' schemas, fake implementations and autograd formula.

  ladder::fwd(q, k, v, causal, scale, rung) -> (out, lse, lse_lo)
  ladder::bwd(dout, q, k, v, out, lse, lse_lo, causal, scale, rung) -> (dq, dk, dv)

The real implementations are C++ (python/csrc: ops_cpu.cpp for rung 0, ops_cuda.cpp for the GPU
rungs), registered per dispatch key when _native loads their libraries, and so is the autograd
formula (ops_cpu.cpp, a C++ autograd function at the Autograd key for every device: the backward
calls ladder::bwd, the rung's own backward kernels). This module imports nothing from the
package but the rungs' table, so that the libraries' loader can import it first (schemas before
kernels) without a cycle. The fake implementations give torch.compile the outputs' shapes and
dtypes without running anything. lse_lo is LSE's rounding residual, which rung 05's backward
reads ([B, H, M] there, an empty [0] for the other rungs).
"""

from __future__ import annotations

import torch

from .rungs import rung as rung_row

_lib = torch.library.Library("ladder", "DEF")  # kept alive: the schemas live as long as it does
_lib.define(
    "fwd(Tensor q, Tensor k, Tensor v, bool causal, float scale, int rung) "
    "-> (Tensor out, Tensor lse, Tensor lse_lo)"
)
_lib.define(
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor lse_lo, "
    "bool causal, float scale, int rung) -> (Tensor dq, Tensor dk, Tensor dv)"
)


@torch.library.register_fake("ladder::fwd")
def _fwd_fake(q, k, v, causal, scale, rung):
    b, h, m, _ = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse_lo_shape = (b, h, m) if rung_row(rung).lse_lo else (0,)
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        q.new_empty((b, h, m), dtype=lse_dtype),
        q.new_empty(lse_lo_shape, dtype=torch.float32),
    )


@torch.library.register_fake("ladder::bwd")
def _bwd_fake(dout, q, k, v, out, lse, lse_lo, causal, scale, rung):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        torch.empty_like(k, memory_format=torch.contiguous_format),
        torch.empty_like(v, memory_format=torch.contiguous_format),
    )
