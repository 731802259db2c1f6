"""Rung 0 (the float64 oracle) through the operator, on the CPU: forward, gradients, gradcheck,
errors, fake tensors and torch.compile. Runs wherever PyTorch and a C++ compiler are."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import attention_reference as ref  # noqa: E402

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
