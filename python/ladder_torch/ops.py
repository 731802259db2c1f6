"""The ladder:: operators: their schemas, fake implementations and autograd formula, and
ladder_attention(), the call a model makes.

  ladder::fwd(q, k, v, causal, scale, rung) -> (out, lse, lse_lo)
  ladder::bwd(dout, q, k, v, out, lse, lse_lo, causal, scale, rung) -> (dq, dk, dv)

The real implementations are C++ (python/csrc: ops_cpu.cpp for rung 0, ops_cuda.cpp for the
GPU rungs), registered per dispatch key when build.load() loads their libraries. The fake
implementations below give torch.compile the outputs' shapes and dtypes without running
anything, and register_autograd makes loss.backward() call ladder::bwd, that is, the rung's
own backward kernels. lse_lo is LSE's rounding residual, which rung 05's backward reads
([B, H, M] there, an empty [0] for the other rungs); it never reaches the caller.
"""

from __future__ import annotations

import math

import torch

from . import build
from .rungs import RUNGS, Rung
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


def _ensure_kernels(row: Rung, device: torch.device, check_device: bool = True) -> None:
    """Loads (building if needed) the library that holds the rung's real implementation and,
    with check_device, checks that the GPU can run what it was compiled for. Raises a clear
    error otherwise."""
    build.load(row.device)
    if check_device and row.device == "cuda" and device not in _checked_devices:
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) != (9, 0):
            raise RuntimeError(
                f"ladder: rung {row.number} is compiled for {row.arch} (H100/H200); "
                f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}"
            )
        _checked_devices.add(device)


_checked_devices: set[torch.device] = set()  # GPUs whose architecture _ensure_kernels accepted


@torch.library.register_fake("ladder::fwd")
def _fwd_fake(q, k, v, causal, scale, rung):
    row = rung_row(rung)
    if q.device.type != "meta":
        # torch.compile traces with fake tensors: the compiled graph will call the real kernels,
        # so their library must be loaded by then. Tracing runs this function for real.
        _ensure_kernels(row, q.device, check_device=False)
    b, h, m, _ = q.shape
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse_lo_shape = (b, h, m) if row.lse_lo else (0,)
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


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, rung = inputs
    out, lse, lse_lo = output
    ctx.save_for_backward(q, k, v, out, lse, lse_lo)
    ctx.causal, ctx.scale, ctx.rung = causal, scale, rung
    # The kernels' backward takes dO only: a loss through LSE would need dS += P o dLSE.
    ctx.mark_non_differentiable(lse, lse_lo)


def _backward(ctx, dout, _dlse, _dlse_lo):
    q, k, v, out, lse, lse_lo = ctx.saved_tensors
    dq, dk, dv = torch.ops.ladder.bwd(
        dout, q, k, v, out, lse, lse_lo, ctx.causal, ctx.scale, ctx.rung
    )
    return dq, dk, dv, None, None, None


torch.library.register_autograd("ladder::fwd", _backward, setup_context=_setup_context)


def _check(q, k, v, row: Rung, scale, causal) -> None:
    """Everything the kernels need, as Python exceptions that say what is accepted."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"ladder: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"ladder: {name} must be 4-D [batch, heads, seq, dim] (as SDPA's), "
                f"got shape {tuple(t.shape)}"
            )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"ladder: q, k, v on different devices: {q.device}, {k.device}, {v.device}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"ladder: q, k, v of different dtypes: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device.type != row.device:
        raise ValueError(
            f"ladder: rung {row.number} runs on {row.device} tensors; q is on {q.device}"
            + (" (rung 0 is the CPU rung)" if row.device == "cuda" else "")
        )
    if q.dtype not in row.dtypes:
        raise TypeError(f"ladder: {row.describe()}; got {q.dtype}")
    b, h, _, d = q.shape
    if d < 1:
        raise ValueError(
            f"ladder: the head dim must be at least 1, got q of shape {tuple(q.shape)}"
        )
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(
            "ladder: k and v must be [batch, heads_kv, seq_k, dim] with q's batch and dim; "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    hkv = k.shape[1]
    if (hkv == 0 and h != 0) or (hkv != 0 and h % hkv != 0):
        raise ValueError(f"ladder: q's heads ({h}) must be a multiple of k's and v's ({hkv})")
    if not row.takes_dim(d):
        raise ValueError(f"ladder: head dim {d} not built; {row.describe()}")
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad and not row.has_backward(d):
        raise ValueError(f"ladder: no backward for head dim {d}; {row.describe()}")
    if scale is not None and not (math.isfinite(scale) and scale != 0):
        raise ValueError(f"ladder: scale must be finite and non-zero, got {scale}")
    if not isinstance(causal, bool):
        raise TypeError(f"ladder: causal must be a bool, got {type(causal).__name__}")


def ladder_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    rung: int = 6,
    return_lse: bool = False,
):
    """Scaled dot-product attention through one of the ladder's rungs.

    q: [B, H, M, d]; k, v: [B, Hkv, N, d] with H a multiple of Hkv (GQA/MQA: query head h
    reads K/V head h // (H // Hkv)), as torch.nn.functional.scaled_dot_product_attention with
    enable_gqa=True. scale defaults to 1/sqrt(d); any finite non-zero scale is allowed.
    causal: key j visible to query i iff j <= i + N - M (bottom-right aligned, as
    FlashAttention; the same as SDPA's is_causal when M == N). A query row that sees no key
    gets zeros and LSE = -inf.
    rung: 6 (tensor cores; bfloat16, float16; d 32, 64, 96, 128), 7 (Hopper: TMA and wgmma;
    bfloat16, float16; d 64, 128), 5 (float32; d 64, 128),
    0 (the float64 oracle, CPU tensors of float64 or float32: for gradcheck); see RUNGS.
    Returns out [B, H, M, d] (q's dtype), and with return_lse=True also LSE [B, H, M]
    (natural log; float32, float64 for rung 0 in float64), which carries no gradient.
    Gradients flow to q, k, v through the rung's own backward kernels.
    """
    row = rung_row(rung)
    _check(q, k, v, row, scale, causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if not torch.compiler.is_compiling():  # under torch.compile the fake impl loads it
        _ensure_kernels(row, q.device)
    out, lse, _ = torch.ops.ladder.fwd(q, k, v, causal, float(scale), rung)
    return (out, lse) if return_lse else out


def available_rungs() -> list[str]:
    """One line per rung: what it takes, and whether it can run in this process."""
    lines = []
    for row in RUNGS.values():
        try:
            if row.device == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("no CUDA device")
            build.load(row.device)
            state = "ready"
        except Exception as e:  # report, do not raise: this is a listing
            state = f"unavailable: {str(e).splitlines()[0]}"
        lines.append(f"{row.describe()} -- {state}")
    return lines
