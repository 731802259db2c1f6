"""attention(): scaled dot-product attention through one of the ladder's rungs, in the shape of
torch.nn.functional.scaled_dot_product_attention; the checks that turn unsupported input into
an exception naming what is supported.
"""

from __future__ import annotations

import math

import torch

from . import _native
from .rungs import RUNGS, Rung
from .rungs import rung as rung_row

_NAMES = {torch.float64: "float64", torch.float32: "float32"}
_NAMES.update({torch.float16: "float16", torch.bfloat16: "bfloat16"})


def describe(number: int) -> str:
    """What rung `number` takes in this installation, from its library's own registry."""
    row = rung_row(number)
    caps = _native.capabilities(number)
    if not caps:
        return f"rung {number} ({row.name}, {row.device}): not available: " + str(
            _native.why_unavailable(row.device)
        )
    parts = []
    for dtype, dims in caps.items():
        fwd = "any d" if 0 in dims else "d " + " ".join(map(str, sorted(dims)))
        no_bwd = sorted(d for d, b in dims.items() if not b)
        parts.append(f"{_NAMES[dtype]} {fwd}" + (f" (no backward at d {no_bwd})" if no_bwd else ""))
    return f"rung {number} ({row.name}, {row.device}): " + "; ".join(parts)


def _takes(number: int, dtype: torch.dtype, dim: int, backward: bool) -> bool:
    dims = _native.capabilities(number).get(dtype, {})
    has = dims.get(dim, dims.get(0))
    return has is not None and (has or not backward)


def _pick_rung(q: torch.Tensor, backward: bool) -> int:
    """rung=None: rung 0 on the CPU; on a GPU the highest rung that takes q's dtype and head dim."""
    if q.device.type == "cpu":
        return 0
    for number in sorted(RUNGS, reverse=True):
        row = RUNGS[number]
        if row.device == q.device.type and _takes(number, q.dtype, q.shape[-1], backward):
            return number
    listing = "\n  ".join(describe(n) for n in RUNGS if RUNGS[n].device == q.device.type)
    raise TypeError(
        f"ladder: no rung takes {q.dtype} q, k, v with head dim {q.shape[-1]} on "
        f"{q.device.type}"
        + (" with a backward" if backward else "")
        + (f". Rungs:\n  {listing}" if listing else "")
    )


def _check(q, k, v, row: Rung, scale, causal, backward: bool) -> None:
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
    caps = _native.capabilities(row.number)
    if not caps:
        raise _native.ExtensionUnavailable(str(_native.why_unavailable(row.device)))
    if q.dtype not in caps:
        raise TypeError(f"ladder: {describe(row.number)}; got {q.dtype}")
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
    if not _takes(row.number, q.dtype, d, False):
        raise ValueError(f"ladder: head dim {d} not built; {describe(row.number)}")
    if backward and not _takes(row.number, q.dtype, d, True):
        raise ValueError(f"ladder: no backward for head dim {d}; {describe(row.number)}")
    if scale is not None and not (math.isfinite(scale) and scale != 0):
        raise ValueError(f"ladder: scale must be finite and non-zero, got {scale}")
    if not isinstance(causal, bool):
        raise TypeError(f"ladder: causal must be a bool, got {type(causal).__name__}")


def _autocast(q, k, v):
    """Under autocast the operator (on no autocast list) would see whatever dtype arrives. As SDPA
    does on the GPU, float32 q, k, v are cast to the autocast dtype; on the CPU, rung 0 computes in
    float64 and takes float32, so bf16/fp16 inputs are cast up to float32 instead."""
    dev = q.device.type
    if dev not in ("cuda", "cpu") or not torch.is_autocast_enabled(dev):
        return q, k, v
    if dev == "cuda" and q.dtype == torch.float32:
        want = torch.get_autocast_dtype("cuda")
    elif dev == "cpu" and q.dtype in (torch.float16, torch.bfloat16):
        want = torch.float32
    else:
        return q, k, v
    return q.to(want), k.to(want), v.to(want)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = True,
    *,
    causal: bool | None = None,
    block_mask=None,
    rung: int | None = None,
    return_lse: bool = False,
):
    """Scaled dot-product attention through one of the ladder's rungs; the arguments of
    torch.nn.functional.scaled_dot_product_attention, plus the rung.

    query: [B, H, M, d]; key, value: [B, Hkv, N, d] with H a multiple of Hkv (GQA/MQA: query
    head h reads K/V head h // (H // Hkv), as SDPA with enable_gqa=True). Any strides: a
    layout the kernels cannot read is copied (they read dense rows, 16-byte aligned).
    scale defaults to 1/sqrt(d); any finite non-zero scale is allowed.
    causal: key j visible to query i iff j <= i + N - M (bottom-right aligned, as
    FlashAttention); a query row that sees no key gets zeros and LSE = -inf. is_causal is SDPA's
    (top-left aligned): the same mask when M == N, and refused otherwise rather than silently
    different. attn_mask, dropout_p > 0 and block_mask raise NotImplementedError (the rungs have
    dropout and block masks; the operator does not pass them on yet).
    rung: None picks rung 0 for CPU tensors and, on a GPU, the highest rung that takes the dtype
    and head dim; 7 (Hopper), 6 (tensor cores), 5 (float32), 0 (the float64 oracle, CPU: for
    gradcheck). describe(rung) says what each takes here.
    Under autocast, float32 CUDA inputs are cast to the autocast dtype (as SDPA's are).
    Returns out [B, H, M, d], and with return_lse=True also LSE [B, H, M] (natural log;
    float32, float64 for rung 0 in float64), which carries no gradient.
    """
    q, k, v = query, key, value
    if attn_mask is not None:
        raise NotImplementedError(
            "ladder: attn_mask is not supported: the rungs take causal=True (bottom-right) and "
            "no mask; use SDPA for an arbitrary mask"
        )
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"ladder: dropout_p={dropout_p}: the rungs' dropout is not exposed by the operator "
            "yet; only dropout_p=0.0 is supported"
        )
    if block_mask is not None:
        raise NotImplementedError(
            "ladder: block_mask: the rungs' block-sparse masks are not exposed by the operator "
            "yet; only block_mask=None is supported"
        )
    if not enable_gqa and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
        if q.dim() == 4 and k.dim() == 4 and q.shape[1] != k.shape[1]:
            raise ValueError("ladder: q and k have different head counts and enable_gqa=False")
    if is_causal:
        if causal is False:
            raise ValueError("ladder: is_causal=True and causal=False contradict each other")
        if isinstance(q, torch.Tensor) and q.dim() == 4 and k.dim() == 4:
            if q.shape[2] != k.shape[2]:
                raise ValueError(
                    f"ladder: is_causal=True with seq_q {q.shape[2]} != seq_k {k.shape[2]}: SDPA's "
                    "is_causal is top-left aligned, the rungs' causal mask bottom-right; pass "
                    "causal=True for the bottom-right mask"
                )
        causal = True
    causal = False if causal is None else causal
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor):
        q, k, v = _autocast(q, k, v)
    backward = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)
    )
    if rung is None and isinstance(q, torch.Tensor):
        rung = _pick_rung(q, backward)
    row = rung_row(rung)
    _check(q, k, v, row, scale, causal, backward)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if row.device == "cuda" and not torch.compiler.is_compiling():
        _check_gpu(q.device, row)
    out, lse, _ = torch.ops.ladder.fwd(q, k, v, causal, float(scale), rung)
    return (out, lse) if return_lse else out


_checked_devices: set[torch.device] = set()  # GPUs whose architecture _check_gpu accepted


def _check_gpu(device: torch.device, row: Rung) -> None:
    """The CUDA library is compiled for sm_90a: another GPU gets this error before any launch."""
    if device in _checked_devices:
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        raise RuntimeError(
            f"ladder: rung {row.number} is compiled for {row.arch} (H100/H200); "
            f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}"
        )
    _checked_devices.add(device)


def ladder_attention(q, k, v, *, causal=False, scale=None, rung=None, return_lse=False):
    """The earlier name of attention() with the ladder's arguments only."""
    return attention(q, k, v, causal=causal, scale=scale, rung=rung, return_lse=return_lse)


def available_rungs() -> list[str]:
    """One line per rung: what it takes in this installation, or why it is not available."""
    return [describe(n) for n in RUNGS]
