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


def _features_text(number: int) -> str:
    """What every instantiation of the rung takes beyond dtypes and dims, in words (the
    libraries' registry)."""
    feats = [
        _native.features(number, dtype, dim)
        for dtype, dims in _native.capabilities(number).items()
        for dim in dims
    ]
    words = []
    if feats and all(f.dropout for f in feats):
        words.append("dropout")
    blocks = {f.mask_block for f in feats}
    if len(blocks) == 1 and None not in blocks:
        bq, bk = blocks.pop()
        if (bq, bk) == (1, 1):
            words.append("block masks of any block")
        else:
            words.append(f"block masks of blocks that are multiples of {bq} x {bk}")
    elif blocks - {None}:
        words.append("block masks (the blocks depend on the head dim)")
    if feats and all(f.strides for f in feats):
        words.append("strided q, k, v read in place")
    return "; ".join(words)


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
    extra = _features_text(number)
    return f"rung {number} ({row.name}, {row.device}): " + "; ".join(parts) + (
        f"; {extra}" if extra else ""
    )


def _takes(
    number: int,
    dtype: torch.dtype,
    dim: int,
    backward: bool,
    dropout: bool = False,
    mask_block: tuple[int, int] | None = None,
) -> bool:
    """Whether rung `number` has the instantiation, and the features the call asks for."""
    f = _native.features(number, dtype, dim)
    if f is None or (backward and not f.backward) or (dropout and not f.dropout):
        return False
    return mask_block is None or (
        f.mask_block is not None
        and mask_block[0] % f.mask_block[0] == 0
        and mask_block[1] % f.mask_block[1] == 0
    )


def _pick_rung(q: torch.Tensor, backward: bool, dropout: bool, mask_block) -> int:
    """rung=None: rung 0 on the CPU; on a GPU the highest rung that takes q's dtype and head dim
    (and the call's dropout and mask block)."""
    if q.device.type == "cpu":
        return 0
    for number in sorted(RUNGS, reverse=True):
        row = RUNGS[number]
        if row.device == q.device.type and _takes(
            number, q.dtype, q.shape[-1], backward, dropout, mask_block
        ):
            return number
    listing = "\n  ".join(describe(n) for n in RUNGS if RUNGS[n].device == q.device.type)
    raise TypeError(
        f"ladder: no rung takes {q.dtype} q, k, v with head dim {q.shape[-1]} on "
        f"{q.device.type}"
        + (" with a backward" if backward else "")
        + (" with dropout" if dropout else "")
        + (f" with mask blocks of {mask_block[0]} x {mask_block[1]}" if mask_block else "")
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


def _mask_block(mask_block) -> tuple[int, int]:
    """mask_block=bm or (bm, bn) as (bm, bn), each a whole number of at least 1."""
    try:
        pair = (mask_block,) * 2 if isinstance(mask_block, int) else tuple(mask_block)
    except TypeError:  # not a sequence
        pair = ()
    if len(pair) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in pair):
        raise ValueError(f"ladder: mask_block must be an int or a pair of ints, got {mask_block!r}")
    if min(pair) < 1:
        raise ValueError(f"ladder: mask_block must be at least 1 x 1, got {pair}")
    return pair


def _check_features(q, k, row: Rung, dropout_p, block_mask, mask_block) -> None:
    """Dropout and a block mask: what the rung takes (its library's registry) and the mask's
    shape, as exceptions that say what is accepted."""
    f = _native.features(row.number, q.dtype, q.shape[-1])
    if dropout_p > 0 and not f.dropout:
        raise NotImplementedError(
            f"ladder: rung {row.number} has no dropout; {describe(row.number)}"
        )
    if block_mask is None:
        return
    if not isinstance(block_mask, torch.Tensor) or block_mask.dtype != torch.bool:
        is_tensor = isinstance(block_mask, torch.Tensor)
        got = block_mask.dtype if is_tensor else type(block_mask).__name__
        raise TypeError(f"ladder: block_mask must be a bool tensor, got {got}")
    if f.mask_block is None:
        raise NotImplementedError(
            f"ladder: rung {row.number} has no block masks; {describe(row.number)}"
        )
    bq, bk = mask_block
    if bq % f.mask_block[0] or bk % f.mask_block[1]:
        raise ValueError(
            f"ladder: rung {row.number} takes mask blocks that are multiples of "
            f"{f.mask_block[0]} x {f.mask_block[1]} (its tiles); got {bq} x {bk}"
        )
    b, h, m, _ = q.shape
    shape = (b, h, -(-m // bq), -(-k.shape[2] // bk))
    got = tuple(block_mask.shape)
    if not (len(got) == 4 and got[0] in (1, b) and got[1] in (1, h) and got[2:] == shape[2:]):
        raise ValueError(
            f"ladder: block_mask must be [1 or batch, 1 or heads, ceil(seq_q / {bq}), "
            f"ceil(seq_k / {bk})] = [1 or {b}, 1 or {h}, {shape[2]}, {shape[3]}] for mask "
            f"blocks of {bq} x {bk}; got {list(got)}"
        )
    if block_mask.device != q.device:
        raise ValueError(
            f"ladder: block_mask must be on q's device ({q.device}); got {block_mask.device}"
        )


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
    block_mask: torch.Tensor | None = None,
    mask_block: int | tuple[int, int] = 128,
    rung: int | None = None,
    return_lse: bool = False,
):
    """Scaled dot-product attention through one of the ladder's rungs; the arguments of
    torch.nn.functional.scaled_dot_product_attention, plus the rung and a block mask.

    query: [B, H, M, d]; key, value: [B, Hkv, N, d] with H a multiple of Hkv (GQA/MQA: query
    head h reads K/V head h // (H // Hkv), as SDPA with enable_gqa=True). Any strides: rung 07
    reads views in place (a model's qkv.view(B, T, 3, H, d) seen as [B, H, T, d]: every stride a
    multiple of 16 bytes, the head dim contiguous, 16-byte aligned) and then returns out in the
    same [B, M, H, d] storage, as SDPA's flash backend does, so that
    out.transpose(1, 2).reshape(B, M, H * d) is free; the other rungs, and a layout outside that
    rule, get a dense copy (torch.ops.ladder.cuda_counters() counts them: ops.layout_copies).
    scale defaults to 1/sqrt(d); any finite non-zero scale is allowed.
    causal: key j visible to query i iff j <= i + N - M (bottom-right aligned, as
    FlashAttention); a query row that sees no key gets zeros and LSE = -inf. is_causal is SDPA's
    (top-left aligned): the same mask when M == N, and refused otherwise rather than silently
    different. attn_mask (an arbitrary mask) raises NotImplementedError.
    dropout_p: dropout on the attention weights, O = (P o Z / (1 - p)) V, applied whenever
    dropout_p > 0 (as SDPA's functional form; the modules apply it in training only). Z is the
    contract's (docs/CONTRACT.md: Philox4x32-10 keyed by a 64-bit seed and (b, h, i, j)), the
    same on every rung: under the same seed, rungs 05, 06, 07 and the oracle drop the same
    weights. The seed is drawn on each call from torch's default CPU generator, so
    torch.manual_seed(s) makes runs reproducible; it reaches the operator as a CPU tensor, so
    torch.compile(fullgraph=True) traces its drawing into the graph (inductor draws it with its
    own generator, seeded from the default one: reproducible under a seed too, but not the same
    numbers as eager). The backward regenerates the forward's Z from the saved seed. CUDA graphs:
    the seed is read on the host when the kernel is enqueued, so a captured call would repeat
    one mask on every replay; the GPU rungs refuse dropout while a stream is being captured
    (torch.cuda.graph, torch.compile(mode="reduce-overhead")): use dropout_p = 0 there.
    block_mask: which (query block, key block) pairs are computed: a bool tensor
    [Bm, Hm, ceil(M / bm), ceil(N / bn)] on q's device, Bm 1 or B, Hm 1 or H (1: shared), for
    mask blocks of mask_block = bm or (bm, bn) (default 128 x 128); the causal mask still applies
    inside. A row whose blocks are all dropped sees no key (zeros, LSE = -inf). The operator
    turns it into the kernels' lists of kept blocks on the device (no synchronisation), each
    call. Rung 0 takes any mask block; a GPU rung takes multiples of its tiles (describe(rung)).
    rung: None picks rung 0 for CPU tensors and, on a GPU, the highest rung that takes the dtype,
    head dim, dropout and mask block; 7 (Hopper), 6 (tensor cores), 5 (float32), 0 (the float64
    oracle, CPU: for gradcheck). describe(rung) says what each takes here.
    Under autocast, float32 CUDA inputs are cast to the autocast dtype (as SDPA's are).
    Returns out [B, H, M, d], and with return_lse=True also LSE [B, H, M] (natural log, of the
    undropped P; float32, float64 for rung 0 in float64), which carries no gradient.
    """
    q, k, v = query, key, value
    if attn_mask is not None:
        raise NotImplementedError(
            "ladder: attn_mask is not supported: the rungs take causal=True (bottom-right) and "
            "block masks (block_mask=); use SDPA for an arbitrary mask"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"ladder: dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"ladder: dropout_p must be in [0, 1), got {dropout_p}")
    mask_block = _mask_block(mask_block)
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
        rung = _pick_rung(
            q, backward, dropout_p > 0, mask_block if block_mask is not None else None
        )
    row = rung_row(rung)
    _check(q, k, v, row, scale, causal, backward)
    _check_features(q, k, row, dropout_p, block_mask, mask_block)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if row.device == "cuda" and not torch.compiler.is_compiling():
        _check_gpu(q.device, row)
    # The dropout seed: 63 random bits from the default CPU generator (see the docstring).
    seed = torch.randint(2**63 - 1, (1,), dtype=torch.int64) if dropout_p > 0 else None
    out, lse, _ = torch.ops.ladder.fwd(
        q, k, v, causal, float(scale), rung, float(dropout_p), seed, block_mask, *mask_block
    )
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
