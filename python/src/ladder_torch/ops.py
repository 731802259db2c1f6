"""attention(): scaled dot-product attention through one of the ladder's rungs, in the shape of
torch.nn.functional.scaled_dot_product_attention; the checks that turn unsupported input into
an exception naming what is supported.
"""

from __future__ import annotations

import math
import numbers

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
        f"ladder: no rung takes {q.dtype} q, k, v (their dtype) with head dim {q.shape[-1]} "
        f"(their last dim) on {q.device.type}"
        + (" with a backward" if backward else "")
        + (" with dropout" if dropout else "")
        + (f" with mask blocks of {mask_block[0]} x {mask_block[1]}" if mask_block else "")
        + (f". Rungs:\n  {listing}" if listing else "")
    )


def _check_tensors(q, k, v) -> None:
    """q, k, v as every rung needs them, before one is picked: tensors, 4-D, on one device of a
    kind that some rung runs on, of one dtype."""
    for name, arg, t in (("q", "query", q), ("k", "key", k), ("v", "value", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(
                f"ladder: {name} ({arg}) must be a torch.Tensor [batch, heads, seq, dim], got "
                f"{type(t).__name__}"
            )
        if t.dim() != 4:
            raise ValueError(
                f"ladder: {name} ({arg}) must be 4-D [batch, heads, seq, dim] (as SDPA's), "
                f"got shape {tuple(t.shape)}"
            )
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"ladder: q, k and v must be on one device; got devices q {q.device}, k {k.device}, "
            f"v {v.device}"
        )
    if q.device.type not in {r.device for r in RUNGS.values()}:
        where = ", ".join(f"rung {r.number} on {r.device}" for r in RUNGS.values())
        raise ValueError(
            f"ladder: no rung runs on {q.device.type} tensors (q, k, v's device); the rungs run "
            f"on cpu or cuda tensors: {where}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"ladder: q, k and v must have one dtype; got dtypes q {q.dtype}, k {k.dtype}, "
            f"v {v.dtype}"
        )


def _check(q, k, v, row: Rung, backward: bool) -> None:
    """Everything the kernels need, as Python exceptions that say what is accepted."""
    if q.device.type != row.device:
        raise ValueError(
            f"ladder: rung {row.number} runs on {row.device} tensors; q, k, v are on {q.device}"
            + (" (rung 0 is the CPU rung; rung=None picks one)" if row.device == "cuda" else "")
        )
    caps = _native.capabilities(row.number)
    if not caps:
        raise _native.ExtensionUnavailable(str(_native.why_unavailable(row.device)))
    if q.dtype not in caps:
        takes = ", ".join(_NAMES[dtype] for dtype in caps)
        raise TypeError(
            f"ladder: rung {row.number} does not take {q.dtype} q, k, v (their dtype): it takes "
            f"{takes}. {describe(row.number)}"
        )
    b, h, _, d = q.shape
    if d < 1:
        raise ValueError(
            f"ladder: the head dim (q's last dim) must be at least 1, got q of shape "
            f"{tuple(q.shape)}"
        )
    layout = "q [batch, heads, seq_q, dim], k and v [batch, heads_kv, seq_k, dim]"
    shapes = f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape != v.shape:
        raise ValueError(f"ladder: k and v must have one shape ({layout}); {shapes}")
    if k.shape[0] != b:
        raise ValueError(
            f"ladder: k's and v's batch ({k.shape[0]}) must be q's ({b}) ({layout}); {shapes}"
        )
    if k.shape[3] != d:
        raise ValueError(
            f"ladder: k's and v's head dim ({k.shape[3]}) must be q's ({d}) ({layout}); {shapes}"
        )
    hkv = k.shape[1]
    if hkv == 0 and h != 0:
        raise ValueError(
            f"ladder: k and v have no heads (heads_kv 0) while q has {h}: heads_kv must be at "
            f"least 1 and divide q's heads; {shapes}"
        )
    if hkv != 0 and h % hkv != 0:
        raise ValueError(
            f"ladder: q's heads ({h}) must be a multiple of k's and v's heads (heads_kv {hkv}): "
            f"each k, v head serves heads / heads_kv query heads (GQA, MQA); {shapes}"
        )
    if not _takes(row.number, q.dtype, d, False):
        raise ValueError(
            f"ladder: rung {row.number} has no {_NAMES[q.dtype]} kernel for head dim {d} (q, k, "
            f"v's last dim) in this build; {describe(row.number)}"
        )
    if backward and not _takes(row.number, q.dtype, d, True):
        raise ValueError(
            f"ladder: rung {row.number} has no backward for head dim {d} ({_NAMES[q.dtype]}), "
            f"and q, k or v requires grad (run it under torch.no_grad() for the forward only); "
            f"{describe(row.number)}"
        )


def _scale(scale) -> float | None:
    """scale as a float (None stays None: 1/sqrt(d)): a real number, or a one-element real tensor
    (as SDPA takes), finite and non-zero."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        is_real = scale.numel() == 1 and not (scale.is_complex() or scale.dtype == torch.bool)
    else:
        is_real = not isinstance(scale, bool) and isinstance(scale, (float, int, numbers.Real))
    if not is_real:  # (the message is built here only: torch.compile traces a float scale)
        if isinstance(scale, torch.Tensor):
            got = f"a {scale.dtype} tensor of shape {tuple(scale.shape)}"
        else:
            got = f"{type(scale).__name__} {scale!r}"
        raise TypeError(
            f"ladder: scale must be a float (finite and non-zero; None for 1/sqrt(head dim)), "
            f"got {got}"
        )
    try:
        value = float(scale)
    except OverflowError:
        value = math.inf
    if not (math.isfinite(value) and value != 0):
        shown = str(scale) if len(str(scale)) <= 40 else str(scale)[:37] + "..."
        raise ValueError(
            f"ladder: scale must be finite and non-zero (None for 1/sqrt(head dim)), got {shown}"
        )
    return value


def _flag(name: str, value, also: str = "") -> None:
    """A bool argument, refused when it is anything else (as SDPA refuses is_causal=1)."""
    if not isinstance(value, bool):
        raise TypeError(
            f"ladder: {name} must be a bool{also}, got {type(value).__name__} {value!r}"
        )


def _mask_block(mask_block) -> tuple[int, int]:
    """mask_block=bm or (bm, bn) as (bm, bn), each a whole number of at least 1."""

    def whole(x):
        return isinstance(x, numbers.Integral) and not isinstance(x, bool)

    try:
        pair = (mask_block,) * 2 if whole(mask_block) else tuple(mask_block)
    except TypeError:  # not a sequence
        pair = ()
    if len(pair) != 2 or not all(map(whole, pair)):
        raise ValueError(
            "ladder: mask_block must be an int bm or a pair of ints (bm, bn), the block mask's "
            f"blocks of bm query rows x bn keys; got {mask_block!r}"
        )
    pair = (int(pair[0]), int(pair[1]))
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
        raise TypeError(
            "ladder: block_mask must be a bool tensor (True: the block pair is computed) or None, "
            f"got {got}"
        )
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
    The backward is once differentiable: a second derivative (create_graph=True, then a gradient
    of the gradients; gradgradcheck) raises a RuntimeError, as SDPA's flash backend does.
    Unsupported input raises an exception that names the argument and what is supported.
    """
    q, k, v = query, key, value
    if attn_mask is not None:
        raise NotImplementedError(
            "ladder: attn_mask is not supported: the rungs take causal=True (bottom-right) and "
            "block masks (block_mask=); use SDPA for an arbitrary mask"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (float, int, numbers.Real)):
        raise TypeError(
            f"ladder: dropout_p must be a float in [0, 1), got {type(dropout_p).__name__}"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(
            f"ladder: dropout_p (the probability of dropping a weight) must be in [0, 1), "
            f"got {dropout_p}"
        )
    mask_block = _mask_block(mask_block)
    _flag("is_causal", is_causal)
    if causal is not None:
        _flag("causal", causal, " or None (is_causal decides)")
    _flag("enable_gqa", enable_gqa)
    _flag("return_lse", return_lse)
    scale = _scale(scale)
    if rung is not None and (type(rung) is not int or rung not in RUNGS):  # (True is no rung)
        known = ", ".join(f"{r.number} ({r.name}, {r.device})" for r in RUNGS.values())
        raise ValueError(
            f"ladder: no rung {rung!r}; rung must be None (the highest rung that takes the call) "
            f"or one of {known}"
        )
    _check_tensors(q, k, v)
    if not enable_gqa and q.shape[1] != k.shape[1]:
        raise ValueError(
            f"ladder: q has {q.shape[1]} heads and k, v {k.shape[1]}: different head counts "
            "(GQA, MQA) need enable_gqa=True (the default)"
        )
    if is_causal:
        if causal is False:
            raise ValueError(
                "ladder: is_causal=True and causal=False contradict each other; pass one of them"
            )
        if q.shape[2] != k.shape[2]:
            raise ValueError(
                f"ladder: is_causal=True with seq_q {q.shape[2]} != seq_k {k.shape[2]}: SDPA's "
                "is_causal is top-left aligned, the rungs' causal mask bottom-right; pass "
                "causal=True for the bottom-right mask"
            )
        causal = True
    causal = False if causal is None else causal
    q, k, v = _autocast(q, k, v)
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if rung is None:
        rung = _pick_rung(
            q, backward, dropout_p > 0, mask_block if block_mask is not None else None
        )
    row = rung_row(rung)
    _check(q, k, v, row, backward)
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
