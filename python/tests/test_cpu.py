"""Rung 0 (the float64 oracle) through the operator, on the CPU: forward, gradients, gradcheck,
errors, fake tensors and torch.compile. Runs wherever PyTorch and a C++ compiler are."""

import math
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import attention_reference as ref  # noqa: E402

import ladder_torch  # noqa: E402
from ladder_torch import ladder_attention  # noqa: E402

# (batch, heads, heads_kv, seq_q, seq_k, dim, causal, scale)
CASES = [
    (1, 1, 1, 1, 1, 8, False, None),
    (2, 4, 4, 13, 29, 16, False, None),
    (2, 4, 4, 13, 29, 16, True, None),
    (1, 3, 3, 21, 8, 16, True, None),  # seq_q > seq_k: rows 0..12 see no key
    (2, 6, 2, 17, 17, 8, True, None),  # GQA 3:1
    (1, 4, 1, 9, 33, 24, False, -0.4),  # MQA, negative scale
    (1, 2, 2, 40, 40, 32, True, 0.9),
]


def case_id(c):
    b, h, hkv, m, n, d, causal, scale = c
    return (
        f"b{b}h{h}kv{hkv}m{m}n{n}d{d}{'c' if causal else ''}{'' if scale is None else f's{scale}'}"
    )


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_rung0_matches_sdpa(case, dtype):
    b, h, hkv, m, n, d, causal, scale = case
    q, k, v, do = ref.inputs(b, h, hkv, m, n, d, dtype, "cpu")
    ours = ref.forward_backward(
        lambda q, k, v: ladder_attention(q, k, v, causal=causal, scale=scale, rung=0), q, k, v, do
    )
    theirs = ref.forward_backward(lambda q, k, v: ref.sdpa(q, k, v, causal, scale), q, k, v, do)
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for name, a, e in zip(("out", "dq", "dk", "dv"), ours, theirs):
        assert a.dtype == dtype and a.shape == e.shape, name
        assert ref.max_err(a, e) <= tol * max(1.0, e.abs().max().item()), name
    _, lse = ladder_attention(q, k, v, causal=causal, scale=scale, rung=0, return_lse=True)
    want = ref.lse(q, k, causal, scale)
    assert lse.shape == (b, h, m)
    assert torch.equal(torch.isinf(lse), torch.isinf(want))  # -inf exactly where no key
    finite = torch.isfinite(want)
    assert ref.max_err(lse[finite], want[finite]) <= tol * 10


def test_fully_masked_rows_are_zero_with_zero_gradients():
    q, k, v, do = ref.inputs(1, 2, 2, 10, 4, 8, torch.float64, "cpu")
    out, dq, dk, dv = ref.forward_backward(
        lambda q, k, v: ladder_attention(q, k, v, causal=True, rung=0), q, k, v, do
    )
    _, lse = ladder_attention(q, k, v, causal=True, rung=0, return_lse=True)
    assert torch.all(out[:, :, :6] == 0) and torch.all(dq[:, :, :6] == 0)
    assert torch.all(lse[:, :, :6] == -math.inf) and torch.all(torch.isfinite(lse[:, :, 6:]))
    assert torch.all(torch.isfinite(dk)) and torch.all(torch.isfinite(dv))


@pytest.mark.parametrize(
    "causal,scale,hkv", [(True, None, 1), (False, -0.7, 2), (True, 1.3, 2)], ids=str
)
def test_gradcheck_through_the_oracle(causal, scale, hkv):
    q, k, v, _ = ref.inputs(1, 2, hkv, 5, 7, 4, torch.float64, "cpu")
    fn = lambda q, k, v: ladder_attention(q, k, v, causal=causal, scale=scale, rung=0)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8)


# What a second derivative raises: the backward is once differentiable, not silently zero.
DOUBLE_BACKWARD = r"ladder_torch: double backward is not supported.*create_graph=True.*SDPBackend"


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
@pytest.mark.parametrize(
    "kwargs",
    [dict(causal=True), dict(dropout_p=0.3), dict(block_mask="half", mask_block=2)],
    ids=["causal", "dropout", "block_mask"],
)
def test_a_second_derivative_raises_instead_of_coming_back_zero(kwargs):
    q, k, v, do = ref.inputs(1, 4, 2, 6, 6, 8, torch.float64, "cpu")
    if kwargs.get("block_mask") == "half":
        kwargs = dict(kwargs, block_mask=torch.tensor([True, False, True]).repeat(1, 1, 3, 1))

    def fn(q, k, v):
        torch.manual_seed(0)  # one dropout mask for every call
        return ladder_torch.attention(q, k, v, **kwargs)

    first = torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    with warnings.catch_warnings():  # no "autograd kernel was not registered" warning either
        warnings.simplefilter("error")
        graph = torch.autograd.grad(fn(q, k, v), (q, k, v), do, create_graph=True)
    # the first derivative under create_graph=True is the same, and records how it was made ...
    assert all(torch.equal(a, b) for a, b in zip(graph, first))
    assert all(g.requires_grad for g in graph)
    # ... so that a gradient of it, with respect to any input, raises
    for wrt in (q, k, v):
        with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
            torch.autograd.grad(graph[0].square().sum(), wrt)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.grad(graph[2].sum(), q, allow_unused=True)
    # .backward(create_graph=True), then a backward of the gradients (a gradient penalty)
    fn(q, k, v).mul(do).sum().backward(create_graph=True)
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        (q.grad.square().sum() + k.grad.sum()).backward()
    q.grad = k.grad = v.grad = None  # (the cycle that backward(create_graph=True) makes)


def test_gradgradcheck_raises_as_sdpa_does():
    q, k, v, _ = ref.inputs(1, 2, 1, 5, 7, 4, torch.float64, "cpu")
    fn = lambda q, k, v: ladder_torch.attention(q, k, v, causal=True)  # noqa: E731
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.gradgradcheck(fn, (q, k, v))
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):  # also when not raising on failure
        torch.autograd.gradgradcheck(fn, (q, k, v), raise_exception=False)
    # the first derivative is untouched
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8)


def test_the_backward_operator_is_once_differentiable_when_called_directly():
    q, k, v, do = ref.inputs(1, 2, 2, 4, 4, 8, torch.float64, "cpu")
    out, lse, lse_lo = torch.ops.ladder.fwd(q, k, v, False, 0.5, 0)
    dq, dk, dv = torch.ops.ladder.bwd(do, q, k, v, out, lse, lse_lo, False, 0.5, 0)
    assert dq.requires_grad  # grad mode is on and q requires grad: the node that refuses
    with pytest.raises(RuntimeError, match=DOUBLE_BACKWARD):
        torch.autograd.grad(dq.sum(), q)
    with torch.no_grad():
        dq0, _, _ = torch.ops.ladder.bwd(do, q, k, v, out, lse, lse_lo, False, 0.5, 0)
    assert not dq0.requires_grad and torch.equal(dq0, dq.detach())


@pytest.mark.parametrize(
    "shape", [(0, 2, 2, 5, 5), (1, 2, 2, 0, 5), (1, 2, 2, 5, 0)], ids=["batch0", "seq_q0", "seq_k0"]
)
def test_empty_shapes(shape):
    b, h, hkv, m, n = shape
    q, k, v, do = ref.inputs(b, h, hkv, m, n, 8, torch.float64, "cpu")
    out, dq, dk, dv = ref.forward_backward(
        lambda q, k, v: ladder_attention(q, k, v, rung=0), q, k, v, do
    )
    assert out.shape == (b, h, m, 8) and torch.all(out == 0)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    _, lse = ladder_attention(q, k, v, rung=0, return_lse=True)
    assert lse.shape == (b, h, m) and torch.all(lse == -math.inf)


def test_lse_carries_no_gradient():
    q, k, v, _ = ref.inputs(1, 1, 1, 4, 4, 8, torch.float64, "cpu")
    out, lse = ladder_attention(q, k, v, rung=0, return_lse=True)
    assert out.requires_grad and not lse.requires_grad


def _t(*shape, dtype=torch.float64):
    return torch.zeros(shape, dtype=dtype)


Q = (1, 1, 4, 8)
I32, F32 = torch.int32, torch.float32

# (q, k, v, keyword arguments, exception, words of its message)
ERRORS = [
    (_t(*Q), _t(*Q), _t(*Q), dict(rung=3), ValueError, "no rung 3"),
    (_t(*Q), _t(*Q), _t(*Q), dict(rung=6), ValueError, "cuda tensors"),
    (_t(1, 4, 8), _t(1, 4, 8), _t(1, 4, 8), dict(rung=0), ValueError, "4-D"),
    (_t(*Q, dtype=I32), _t(*Q, dtype=I32), _t(*Q, dtype=I32), dict(rung=0), TypeError, "float64"),
    (_t(*Q), _t(*Q, dtype=F32), _t(*Q), dict(rung=0), TypeError, "dtypes"),
    (_t(1, 3, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), dict(rung=0), ValueError, "multiple"),
    (_t(1, 2, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 5, 8), dict(rung=0), ValueError, "heads_kv"),
    (_t(1, 2, 4, 8), _t(1, 2, 4, 16), _t(1, 2, 4, 16), dict(rung=0), ValueError, "dim"),
    (_t(1, 1, 4, 0), _t(1, 1, 4, 0), _t(1, 1, 4, 0), dict(rung=0), ValueError, "at least 1"),
    (_t(*Q), _t(*Q), _t(*Q), dict(rung=0, scale=0.0), ValueError, "non-zero"),
    (_t(*Q), _t(*Q), _t(*Q), dict(rung=0, scale=math.nan), ValueError, "finite"),
    (_t(*Q), _t(*Q), _t(*Q), dict(rung=0, causal=1), TypeError, "bool"),
]


@pytest.mark.parametrize("q,k,v,kwargs,error,words", ERRORS)
def test_unsupported_inputs_raise_clear_errors(q, k, v, kwargs, error, words):
    with pytest.raises(error, match=f"(?i){words}"):
        ladder_attention(q, k, v, **kwargs)


# The C++ checks, reached by calling the operator directly: (q, k, v, scale, rung, ...)
OP_ERRORS = [
    (_t(*Q), _t(*Q), _t(*Q), 1.0, 6, NotImplementedError, "CUDA tensors"),
    (_t(1, 3, 4, 8), _t(1, 2, 4, 8), _t(1, 2, 4, 8), 1.0, 0, ValueError, "multiple"),
    (_t(*Q), _t(*Q), _t(*Q), 0.0, 0, ValueError, "non-zero"),
]


@pytest.mark.parametrize("q,k,v,scale,rung,error,words", OP_ERRORS)
def test_the_operator_checks_too(q, k, v, scale, rung, error, words):
    with pytest.raises(error, match=f"(?i){words}"):
        torch.ops.ladder.fwd(q, k, v, False, scale, rung)


# Refusals name the argument and what it takes: (q, k, v, keyword arguments, exception, the
# message as a regular expression). q, k, v: float64 [1, 2, 4, 8] zeros unless given.
X = _t(1, 2, 4, 8)
META = _t(1, 2, 4, 8).to("meta")
NAMED = [
    ([1], X, X, {}, TypeError, r"q \(query\) must be a torch\.Tensor \[batch, heads, seq, dim\]"),
    (X, None, X, {}, TypeError, r"k \(key\) must be a torch\.Tensor"),
    (X, X, _t(2, 4, 8), {}, ValueError, r"v \(value\) must be 4-D \[batch, heads, seq, dim\]"),
    (*(_t(1, 2, 4, 8, dtype=I32),) * 3, {}, TypeError, r"int32 q, k, v \(their dtype\).*float64"),
    (X, _t(1, 2, 4, 8, dtype=F32), X, {}, TypeError, r"one dtype; got dtypes q .*k torch\.float32"),
    (X, META, X, {}, ValueError, r"one device; got devices q cpu, k meta"),
    (META, META, META, {}, ValueError, r"no rung runs on meta tensors.*cpu or cuda"),
    (X, X, X, dict(rung=7), ValueError, r"rung 7 runs on cuda tensors.*rung 0 is the CPU rung"),
    (X, X, X, dict(rung="0"), ValueError, r"no rung '0'; rung must be None .*or one of 0 "),
    (_t(1, 3, 4, 8), X, X, {}, ValueError, r"q's heads \(3\) must be a multiple of .*heads_kv 2"),
    (X, _t(1, 0, 4, 8), _t(1, 0, 4, 8), {}, ValueError, r"heads_kv must be at least 1"),
    (_t(2, 2, 4, 8), X, X, {}, ValueError, r"k's and v's batch \(1\) must be q's \(2\)"),
    (X, _t(1, 2, 4, 4), _t(1, 2, 4, 4), {}, ValueError, r"head dim \(4\) must be q's \(8\)"),
    (X, X, _t(1, 2, 5, 8), {}, ValueError, r"k and v must have one shape .*heads_kv, seq_k"),
    (X, X, X, dict(scale="0.5"), TypeError, r"scale must be a float .*got str '0\.5'"),
    (X, X, X, dict(scale=True), TypeError, r"scale must be a float .*got bool"),
    (X, X, X, dict(scale=math.inf), ValueError, r"scale must be finite and non-zero"),
    (X, X, X, dict(scale=10**400), ValueError, r"scale must be finite and non-zero"),
    (X, X, X, dict(dropout_p=1.0), ValueError, r"dropout_p .*must be in \[0, 1\), got 1\.0"),
    (X, X, X, dict(dropout_p=None), TypeError, r"dropout_p must be a float in \[0, 1\)"),
    (X, X, X, dict(is_causal="no"), TypeError, r"is_causal must be a bool, got str"),
    (X, X, X, dict(causal=1), TypeError, r"causal must be a bool or None"),
    (X, X, X, dict(enable_gqa="no"), TypeError, r"enable_gqa must be a bool"),
    (_t(1, 4, 4, 8), X, X, dict(enable_gqa=False), ValueError, r"need enable_gqa=True"),
    (X, X, X, dict(return_lse=1), TypeError, r"return_lse must be a bool"),
    (X, X, X, dict(mask_block=2.0), ValueError, r"mask_block must be an int bm or a pair"),
    (X, X, X, dict(mask_block=(0, 4)), ValueError, r"mask_block must be at least 1 x 1"),
    (X, X, X, dict(block_mask=torch.ones(1, 1, 1, 1)), TypeError, r"block_mask must be a bool"),
    (
        *(X,) * 3,
        dict(block_mask=torch.ones(1, 1, 2, 2, dtype=torch.bool)),
        ValueError,
        r"block_mask must be \[1 or batch, 1 or heads, ceil\(seq_q / 128\).*got \[1, 1, 2, 2\]",
    ),
    (
        *(X,) * 3,
        dict(block_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device="meta")),
        ValueError,
        r"block_mask must be on q's device \(cpu\); got meta",
    ),
    (X, X, X, dict(attn_mask=torch.ones(4, 4)), NotImplementedError, r"attn_mask is not supported"),
]


@pytest.mark.parametrize("q,k,v,kwargs,error,words", NAMED)
def test_refusals_name_the_argument_and_what_it_takes(q, k, v, kwargs, error, words):
    with pytest.raises(error, match=words):
        ladder_torch.attention(q, k, v, **kwargs)


def test_the_modules_refuse_by_name_too():
    with pytest.raises(ValueError, match=r"heads must be an int of at least 1, got 0"):
        ladder_torch.CausalSelfAttention(32, 0)
    with pytest.raises(ValueError, match=r"d_model \(30\) must be a multiple of heads \(4\)"):
        ladder_torch.CausalSelfAttention(30, 4)
    layer = ladder_torch.CausalSelfAttention(32, 4, dtype=torch.float64)
    for x in (_t(4, 32), _t(1, 4, 16)):
        with pytest.raises(ValueError, match=r"x \[batch, seq, d_model\] with d_model 32"):
            layer(x)
    with pytest.raises(TypeError, match=r"scale must be a float"):
        ladder_torch.ScaledDotProductAttention(scale="1")(X, X, X)


def test_opcheck_rung0():
    q, k, v, _ = ref.inputs(1, 4, 2, 6, 9, 8, torch.float64, "cpu")
    torch.library.opcheck(torch.ops.ladder.fwd.default, (q, k, v, True, 0.5, 0))


def test_fake_tensors_give_shapes_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = _t(2, 6, 100, 64), _t(2, 2, 70, 64), _t(2, 2, 70, 64)
        out, lse, lse_lo = torch.ops.ladder.fwd(q, k, v, True, 0.125, 0)
        assert out.shape == q.shape and lse.shape == (2, 6, 100) and lse_lo.shape == (0,)
        dq, dk, dv = torch.ops.ladder.bwd(out, q, k, v, out, lse, lse_lo, True, 0.125, 0)
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    meta = [t.to("meta") for t in (_t(1, 2, 5, 64, dtype=torch.float32),) * 3]
    out, lse, lse_lo = torch.ops.ladder.fwd(*meta, False, 0.125, 5)  # rung 5 keeps lse_lo
    assert lse.dtype == torch.float32 and lse_lo.shape == (1, 2, 5)


class TinyAttention(torch.nn.Module):
    def __init__(self, d_model=32, heads=4, rung=0, dtype=torch.float64):
        super().__init__()
        self.heads, self.rung = heads, rung
        self.qkv = torch.nn.Linear(d_model, 3 * d_model, dtype=dtype)
        self.out = torch.nn.Linear(d_model, d_model, dtype=dtype)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = ladder_attention(q, k, v, causal=True, rung=self.rung)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_rung0(backend):
    torch.manual_seed(0)
    model = TinyAttention()
    x = torch.randn(2, 11, 32, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    y_eager = model(x)
    (g_eager,) = torch.autograd.grad(y_eager.square().sum(), x)
    y = compiled(x)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    assert ref.max_err(y, y_eager) < 1e-12 and ref.max_err(g, g_eager) < 1e-12
