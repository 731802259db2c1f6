"""Dropout, block masks and strided inputs through the operator, on the CPU (rung 0, the float64
oracle): the contract's dropout mask Z (checked against its definition, written out in
attention_reference.py), reproducibility under torch.manual_seed, dropout's statistics,
gradcheck with a fixed seed and with a block mask, block masks against SDPA with the equivalent
dense mask, opcheck of the schema, fake tensors, strided inputs, errors, and
torch.compile(fullgraph=True) with dropout and a block mask."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import attention_reference as ref  # noqa: E402

import ladder_torch  # noqa: E402
from ladder_torch import attention  # noqa: E402

F64 = torch.float64


def random_blocks(shape, density=0.6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen) < density


# (batch, heads, heads_kv, seq_q, seq_k, dim, causal, scale, dropout p)
DROPOUT_CASES = [
    (1, 2, 2, 20, 20, 8, False, None, 0.3),
    (2, 4, 2, 17, 23, 16, True, None, 0.1),  # GQA, causal with seq_q < seq_k
    (1, 3, 1, 33, 9, 8, True, -0.4, 0.5),  # MQA, rows that see no key, negative scale
]


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=str)
def test_dropout_is_the_contracts_philox_mask(case):
    """O and the gradients equal attention with Z computed from the contract's definition, for
    the seed that attention() draws from torch's generator: the seed's 64 bits reach the oracle
    whole, and the backward regenerates the forward's Z."""
    b, h, hkv, m, n, d, causal, scale, p = case
    q, k, v, do = ref.inputs(b, h, hkv, m, n, d, F64, "cpu")
    z = ref.dropout_keep(ref.seed_after(11), p, b, h, m, n)
    assert 0 < z.float().mean() < 1
    torch.manual_seed(11)
    got = ref.forward_backward(
        lambda q, k, v: attention(q, k, v, dropout_p=p, causal=causal, scale=scale), q, k, v, do
    )
    want = ref.plain(q, k, v, do, causal, scale, z=z, p=p)
    for name, a, e in zip(("out", "dq", "dk", "dv"), got, want):
        assert ref.max_err(a, e) <= 1e-12 * max(1.0, e.abs().max().item()), name


def test_dropout_seed_with_its_high_word_set():
    """A seed from the operator's own argument, with both 32-bit halves of the key non-zero."""
    q, k, v, _ = ref.inputs(1, 2, 2, 40, 40, 8, F64, "cpu", requires_grad=False)
    seed = 0x0123456789ABCDEF
    out, _, _ = torch.ops.ladder.fwd(q, k, v, True, 0.3, 0, 0.25, torch.tensor([seed]))
    z = ref.dropout_keep(seed, 0.25, 1, 2, 40, 40)
    want, *_ = ref.plain(q, k, v, None, True, 0.3, z=z, p=0.25)
    assert ref.max_err(out, want) <= 1e-12
    swapped = (seed >> 32) | ((seed & 0xFFFFFFFF) << 32)
    assert not torch.equal(z, ref.dropout_keep(swapped, 0.25, 1, 2, 40, 40))


def test_dropout_is_reproducible_under_a_seed_and_differs_across_seeds():
    q, k, v, do = ref.inputs(2, 2, 2, 24, 24, 8, F64, "cpu")

    def run(s):
        torch.manual_seed(s)
        return ref.forward_backward(lambda q, k, v: attention(q, k, v, dropout_p=0.2), q, k, v, do)

    first, again, other = run(0), run(0), run(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    # one call draws one seed: two calls in a row differ
    torch.manual_seed(0)
    assert not torch.equal(attention(q, k, v, dropout_p=0.2), attention(q, k, v, dropout_p=0.2))
    # dropout_p = 0 draws nothing from the generator and is exactly no dropout
    torch.manual_seed(0)
    none = attention(q, k, v, dropout_p=0.0)
    next_draw = int(torch.randint(2**63 - 1, (1,), dtype=torch.int64))
    assert torch.equal(none, attention(q, k, v)) and next_draw == ref.seed_after(0)


def dropout_stats(x, ref_x, var_sum, p):
    """tools/peers.py's check: x, with dropout at rate p, against the no-dropout ref_x. Each
    element is unbiased with variance p / (1 - p) var_sum. ratio: the mean of deviation^2 /
    variance (near 1); slope: the deviation regressed on ref_x (near 0; -p without the 1 / (1 - p)
    scaling). Both weigh each element by 1 / variance."""
    var = (p / (1 - p)) * var_sum
    valid = var > 1e-30 * var.max()
    dev, r, var = (x - ref_x)[valid], ref_x[valid], var[valid]
    ratio = ((dev * dev) / var).mean().item()
    slope = ((dev * r / var).sum() / (r * r / var).sum()).item()
    return ratio, slope


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_statistics_of_out_and_dv(p):
    """Against the undropped result, O and dV deviate as dropout at rate p must: unbiased, with
    the variance p / (1 - p) sum_j P_ij^2 V_jd^2 (and sum_i P_ij^2 dO_id^2 for dV)."""
    b, h, m, n, d = 2, 4, 64, 64, 16
    q, k, v, do = ref.inputs(b, h, h, m, n, d, F64, "cpu")
    torch.manual_seed(3)
    out, _, _, dv = ref.forward_backward(
        lambda q, k, v: attention(q, k, v, dropout_p=p, causal=True), q, k, v, do
    )
    out0, _, _, dv0 = ref.forward_backward(
        lambda q, k, v: attention(q, k, v, causal=True), q, k, v, do
    )
    s = (q @ k.transpose(-1, -2)).detach() / math.sqrt(d)
    s = s.masked_fill(~ref.visible(m, n, True, "cpu"), -math.inf)
    pr = torch.softmax(s, dim=-1)
    var_o = (pr * pr) @ (v.detach() ** 2)
    var_dv = (pr * pr).transpose(-1, -2) @ (do**2)
    for name, x, x0, var in (("out", out, out0, var_o), ("dv", dv, dv0, var_dv)):
        ratio, slope = dropout_stats(x, x0, var, p)
        assert 0.75 <= ratio <= 1.33, f"{name}: deviation {ratio:.3f}x dropout's"
        assert abs(slope) <= p / 2, f"{name}: biased by {slope:+.3f} x the undropped result"


def test_gradcheck_with_a_fixed_dropout_seed():
    q, k, v, _ = ref.inputs(1, 2, 1, 6, 9, 4, F64, "cpu")

    def fn(q, k, v):
        torch.manual_seed(5)  # every evaluation the same Z: O is then smooth in q, k, v
        return attention(q, k, v, dropout_p=0.3, causal=True)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8)


def test_gradcheck_with_a_block_mask_and_dropout():
    q, k, v, _ = ref.inputs(2, 2, 2, 7, 10, 4, F64, "cpu")
    mask = torch.tensor([[[[True, False, True], [False, True, True], [True, True, False]]]])

    def fn(q, k, v):
        torch.manual_seed(6)
        return attention(q, k, v, dropout_p=0.2, block_mask=mask, mask_block=(3, 4), causal=True)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8)
    def fn_no_dropout(q, k, v):
        return attention(q, k, v, block_mask=mask, mask_block=(3, 4))

    assert torch.autograd.gradcheck(fn_no_dropout, (q, k, v), eps=1e-6, atol=1e-8)


# (batch, heads, heads_kv, seq_q, seq_k, causal, mask's first two dims, mask block)
MASK_CASES = [
    (2, 4, 2, 21, 30, False, "BH", (4, 8)),
    (2, 4, 2, 21, 30, True, "11", 5),
    (2, 3, 3, 16, 16, True, "B1", (4, 4)),
    (1, 4, 1, 9, 40, False, "1H", (3, 16)),
    (1, 2, 2, 12, 12, False, "11", 128),  # one block: the default size on a short sequence
]


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["f64", "f32"])
def test_block_mask_matches_sdpa_with_the_dense_mask(case, dtype):
    b, h, hkv, m, n, causal, share, mask_block = case
    bm, bn = (mask_block, mask_block) if isinstance(mask_block, int) else mask_block
    shape = (b if share[0] == "B" else 1, h if share[1] == "H" else 1, -(-m // bm), -(-n // bn))
    blocks = random_blocks(shape, seed=m * n)
    if shape[2] > 1:
        blocks[..., 0, :] = False  # the first query block sees no key: zeros, LSE = -inf
    keep = ref.blocks_to_dense(blocks, m, n, mask_block)
    q, k, v, do = ref.inputs(b, h, hkv, m, n, 16, dtype, "cpu")

    def ours(q, k, v):
        return attention(q, k, v, causal=causal, block_mask=blocks, mask_block=mask_block)

    got = ref.forward_backward(ours, q, k, v, do)
    want = ref.forward_backward(lambda q, k, v: ref.sdpa(q, k, v, causal, None, keep), q, k, v, do)
    tol = 1e-10 if dtype == F64 else 2e-5
    for name, a, e in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == dtype and a.shape == e.shape, name
        assert ref.max_err(a, e) <= tol * max(1.0, e.abs().max().item()), name
    _, lse = attention(
        q, k, v, causal=causal, block_mask=blocks, mask_block=mask_block, return_lse=True
    )
    want_lse = ref.lse(q, k, causal, None, keep)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    assert ref.max_err(lse[finite], want_lse[finite]) <= tol * 10


def test_an_all_true_block_mask_is_no_mask():
    q, k, v, _ = ref.inputs(2, 2, 2, 20, 30, 8, F64, "cpu", requires_grad=False)
    full = torch.ones(1, 1, 3, 2, dtype=torch.bool)
    assert torch.equal(
        attention(q, k, v, causal=True, block_mask=full, mask_block=(7, 16)),
        attention(q, k, v, causal=True),
    )


def test_strided_inputs_give_the_contiguous_result_with_dropout_and_a_block_mask():
    torch.manual_seed(0)
    b, t, h, d = 2, 19, 4, 8
    qkv = torch.randn(b, t, 3 * h * d, dtype=F64)
    q, k, v = qkv.view(b, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous() and q.stride(1) < q.stride(2)
    mask = random_blocks((b, 1, 3, 3), seed=1)
    kw = dict(causal=True, block_mask=mask, mask_block=8, dropout_p=0.25)
    torch.manual_seed(1)
    got = attention(q, k, v, **kw)
    torch.manual_seed(1)
    want = attention(q.contiguous(), k.contiguous(), v.contiguous(), **kw)
    assert torch.equal(got, want)


def test_opcheck_with_dropout_and_a_block_mask():
    q, k, v, _ = ref.inputs(2, 4, 2, 6, 9, 8, F64, "cpu")
    mask = random_blocks((1, 4, 2, 3), seed=2)
    seed = torch.tensor([1234], dtype=torch.int64)
    for args in (
        (q, k, v, True, 0.5, 0, 0.2, seed, mask, 4, 3),
        (q, k, v, False, 0.5, 0, 0.0, None, mask, 4, 3),
        (q, k, v, False, 0.5, 0, 0.3, seed),
    ):
        torch.library.opcheck(torch.ops.ladder.fwd.default, args)


def test_fake_tensors_take_the_new_arguments_and_follow_the_output_layout():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 6, 100, 64)
        kv = torch.empty(2, 2, 70, 64)
        mask = torch.empty(2, 1, 1, 1, dtype=torch.bool)
        seed = torch.empty(1, dtype=torch.int64)
        out, lse, _ = torch.ops.ladder.fwd(q, kv, kv, True, 0.1, 0, 0.1, seed, mask, 128, 128)
        assert out.shape == q.shape and lse.shape == (2, 6, 100)
        dq, dk, dv = torch.ops.ladder.bwd(out, q, kv, kv, out, lse, lse, True, 0.1, 0, 0.1, seed)
        assert dq.shape == q.shape and dk.shape == kv.shape
    # Rung 07 writes O in q's [B, M, H, d] storage when q is a view of one (SDPA's flash rule);
    # the others write it dense. Meta tensors run the fake implementation.
    qkv = torch.empty(2, 100, 3, 4, 64, device="meta", dtype=torch.bfloat16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    out7, _, _ = torch.ops.ladder.fwd(q, k, v, True, 0.125, 7)
    assert out7.shape == q.shape and out7.transpose(1, 2).is_contiguous()
    out6, _, _ = torch.ops.ladder.fwd(q, k, v, True, 0.125, 6)
    assert out6.is_contiguous()


def _bools(*shape):
    return torch.ones(shape, dtype=torch.bool)


# (keyword arguments, exception, words of its message)
ERRORS = [
    (dict(dropout_p=1.0), ValueError, r"\[0, 1\)"),
    (dict(dropout_p=-0.1), ValueError, r"\[0, 1\)"),
    (dict(dropout_p="0.1"), TypeError, "float"),
    (dict(block_mask=torch.ones(1, 1, 1, 1)), TypeError, "bool"),
    (dict(block_mask=object()), TypeError, "bool"),
    (dict(block_mask=_bools(1, 1, 2, 1)), ValueError, r"\[1 or 1, 1 or 4, 1, 1\]"),
    (dict(block_mask=_bools(3, 1, 1, 1)), ValueError, "1 or batch"),
    (dict(block_mask=_bools(1, 1, 3, 3), mask_block=(3, 0)), ValueError, "at least 1"),
    (dict(block_mask=_bools(1, 1, 3, 3), mask_block=(3, 3, 3)), ValueError, "pair"),
    (dict(attn_mask=_bools(9, 9)), NotImplementedError, "block_mask="),
]


@pytest.mark.parametrize("kwargs,error,words", ERRORS)
def test_bad_dropout_and_mask_arguments_are_refused_naming_what_is_taken(kwargs, error, words):
    q, k, v, _ = ref.inputs(1, 4, 2, 9, 9, 8, F64, "cpu")
    with pytest.raises(error, match=words):
        attention(q, k, v, **kwargs)


def test_the_operator_checks_dropout_and_the_mask_too():
    q, k, v, _ = ref.inputs(1, 2, 2, 9, 9, 8, F64, "cpu", requires_grad=False)
    with pytest.raises(ValueError, match="seed"):
        torch.ops.ladder.fwd(q, k, v, False, 0.3, 0, 0.1)
    with pytest.raises(ValueError, match="seed"):
        torch.ops.ladder.fwd(q, k, v, False, 0.3, 0, 0.1, torch.tensor([1.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        torch.ops.ladder.fwd(q, k, v, False, 0.3, 0, 1.5, torch.tensor([1]))
    bad = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="block_mask must be"):
        torch.ops.ladder.fwd(q, k, v, False, 0.3, 0, 0.0, None, bad, 16, 16)
    with pytest.raises(TypeError, match="bool"):
        torch.ops.ladder.fwd(q, k, v, False, 0.3, 0, 0.0, None, bad.int(), 5, 5)


def test_describe_says_what_rung0_takes():
    text = ladder_torch.describe(0)
    assert "dropout" in text and "block masks of any block" in text


def test_modules_take_dropout_in_training_only_and_a_block_mask():
    q, k, v, _ = ref.inputs(1, 2, 2, 12, 12, 8, F64, "cpu", requires_grad=False)
    m = ladder_torch.ScaledDotProductAttention(causal=True, dropout_p=0.4, mask_block=4)
    mask = random_blocks((1, 1, 3, 3), seed=4)
    torch.manual_seed(0)
    train = m(q, k, v, block_mask=mask)
    assert not torch.equal(train, attention(q, k, v, causal=True, block_mask=mask, mask_block=4))
    m.eval()
    assert torch.equal(
        m(q, k, v, block_mask=mask), attention(q, k, v, causal=True, block_mask=mask, mask_block=4)
    )
    layer = ladder_torch.CausalSelfAttention(32, 4, dropout_p=0.3, dtype=F64)
    x = torch.randn(2, 6, 32, dtype=F64)
    torch.manual_seed(0)
    a = layer(x)
    torch.manual_seed(0)
    assert torch.equal(a, layer(x)) and not torch.equal(a, layer.eval()(x))


class DroppedMaskedAttention(torch.nn.Module):
    """A layer whose attention has dropout and a block mask, for torch.compile."""

    def __init__(self, d_model=32, heads=4, mask=None):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, dtype=F64)
        self.register_buffer("mask", mask)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return attention(
            q, k, v, dropout_p=0.3, causal=True, block_mask=self.mask, mask_block=4, rung=0
        )


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_with_dropout_and_a_block_mask(backend):
    """fullgraph=True: the seed's drawing is traced into the graph (no graph break). The forward
    is reproducible under torch.manual_seed (aot_eager draws the eager call's seed; inductor
    draws with its own generator, seeded from the default one), and the backward uses the
    forward's Z: for a fixed Z, out = P~ V and dV = P~^T dO, so <out, dO> = <V, dV>."""
    torch.manual_seed(0)
    mask = random_blocks((1, 4, 3, 3), seed=3)
    model = DroppedMaskedAttention(mask=mask)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = torch.randn(2, 11, 32, dtype=F64)
    do = torch.randn(2, 4, 11, 8, dtype=F64)

    def run(fn):
        torch.manual_seed(7)
        xr = x.clone().requires_grad_(True)
        out = fn(xr)
        (gx,) = torch.autograd.grad(out, xr, do)
        return out.detach(), gx

    y, g = run(compiled)
    y_again, g_again = run(compiled)
    assert torch.equal(y, y_again) and torch.equal(g, g_again)
    y_eager, g_eager = run(model)
    if backend == "aot_eager":
        assert ref.max_err(y, y_eager) < 1e-12 and ref.max_err(g, g_eager) < 1e-12
    undropped = attention(*_qkv(model, x), causal=True, block_mask=mask, mask_block=4)
    assert not torch.equal(y, undropped.detach())
    # the linear identity with the compiled forward and backward
    q, k, v = (t.detach() for t in _qkv(model, x))
    v = v.clone().requires_grad_(True)
    def attend_eager(q, k, v):
        return attention(q, k, v, dropout_p=0.3, causal=True, block_mask=mask, mask_block=4)

    attend = torch.compile(attend_eager, backend=backend, fullgraph=True)
    torch.manual_seed(8)
    out = attend(q, k, v)
    (dv,) = torch.autograd.grad(out, v, do)
    lhs, rhs = (out.detach() * do).sum().item(), (v.detach() * dv).sum().item()
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


def _qkv(model, x):
    b, t, c = x.shape
    q, k, v = model.qkv(x).view(b, t, 3, model.heads, c // model.heads).permute(2, 0, 3, 1, 4)
    return q, k, v
