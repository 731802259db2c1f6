"""The package as a user meets it, on the CPU (rung 0, the float64 oracle): the installed
import, attention() in SDPA's shape, the modules, views, autocast, torch.compile(fullgraph=True)
of a layer, and a tiny model trained a few steps with rung 0 and with SDPA, both in float64,
whose losses must agree to rounding: a gradient bug would separate them at once. Dropout, block
masks and strided inputs: test_features.py."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import attention_reference as ref  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ladder_torch  # noqa: E402

PYTHON_DIR = Path(__file__).resolve().parents[1]


def test_the_installed_package_is_imported_with_its_cpu_library():
    here = Path(ladder_torch.__file__).resolve().parent
    assert here != PYTHON_DIR / "src" / "ladder_torch" or any(here.glob("_ladder_cpu*.so"))
    assert ladder_torch._native.why_unavailable("cpu") is None
    assert "rung 0" in ladder_torch.describe(0) and "float64" in ladder_torch.describe(0)


def test_import_in_a_fresh_interpreter_runs_the_operator():
    code = (
        "import torch, ladder_torch; q = torch.ones(1, 1, 3, 4, dtype=torch.float64); "
        "print(ladder_torch.attention(q, q, q).sum().item())"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout.split()[-1]) == 12.0


def test_attention_mirrors_sdpa_and_picks_rung0_on_the_cpu():
    q, k, v, do = ref.inputs(2, 4, 2, 9, 9, 16, torch.float64, "cpu")
    ours = ref.forward_backward(
        lambda q, k, v: ladder_torch.attention(q, k, v, is_causal=True), q, k, v, do
    )
    theirs = ref.forward_backward(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        q,
        k,
        v,
        do,
    )
    for a, e in zip(ours, theirs):
        assert ref.max_err(a, e) <= 1e-12
    # positional arguments in SDPA's order: attn_mask, dropout_p, is_causal, scale
    out = ladder_torch.attention(q, k, v, None, 0.0, False, 0.3)
    assert ref.max_err(out, ref.sdpa(q, k, v, False, 0.3)) <= 1e-12


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        (dict(attn_mask=torch.ones(9, 9, dtype=torch.bool)), NotImplementedError, "attn_mask"),
        (dict(is_causal=True, causal=False), ValueError, "contradict"),
        (dict(enable_gqa=False), ValueError, "enable_gqa"),
    ],
    ids=["attn_mask", "causal-contradiction", "gqa-off"],
)
def test_what_the_operator_does_not_take_is_refused_by_name(kwargs, error, words):
    q, k, v, _ = ref.inputs(1, 4, 2, 9, 9, 8, torch.float64, "cpu")
    with pytest.raises(error, match=words):
        ladder_torch.attention(q, k, v, **kwargs)


def test_is_causal_with_different_lengths_is_refused_not_silently_different():
    q, k, v, _ = ref.inputs(1, 2, 2, 5, 9, 8, torch.float64, "cpu")
    with pytest.raises(ValueError, match="top-left"):
        ladder_torch.attention(q, k, v, is_causal=True)
    out = ladder_torch.attention(q, k, v, causal=True)  # bottom-right: the contract's mask
    assert ref.max_err(out, ref.sdpa(q, k, v, True, None)) <= 1e-12


def test_cuda_rungs_say_why_they_are_missing_or_what_they_take():
    for n in (5, 6, 7):
        text = ladder_torch.describe(n)
        assert text.startswith(f"rung {n} (") and (
            "not available" in text or "bfloat16" in text or "float32" in text
        )


def test_views_of_a_fused_projection_give_the_dense_result():
    torch.manual_seed(0)
    b, t, h, d = 2, 10, 4, 8
    qkv = torch.randn(b, t, 3 * h * d, dtype=torch.float64)
    q, k, v = qkv.view(b, t, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous()
    got = ladder_torch.attention(q, k, v, causal=True)
    want = ladder_torch.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(got, want)


def test_modules_are_drop_ins():
    torch.manual_seed(0)
    q, k, v, _ = ref.inputs(1, 2, 2, 7, 7, 8, torch.float64, "cpu", requires_grad=False)
    m = ladder_torch.ScaledDotProductAttention(causal=True)
    assert ref.max_err(m(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True)) <= 1e-12
    layer = ladder_torch.CausalSelfAttention(32, 4, dtype=torch.float64)
    x = torch.randn(2, 6, 32, dtype=torch.float64, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match="multiple"):
        ladder_torch.CausalSelfAttention(30, 4)


def test_autocast_on_the_cpu_runs_rung0_in_float32():
    torch.manual_seed(0)
    layer = ladder_torch.CausalSelfAttention(32, 4)
    x = torch.randn(2, 6, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)  # the projection gives bf16 q, k, v; rung 0 takes float32
    want = layer(x)
    assert y.dtype == torch.bfloat16  # the output projection ran under autocast
    assert ref.max_err(y, want) <= 0.05 * want.abs().max().item()


def test_torch_compile_fullgraph_of_a_layer_on_the_cpu():
    torch.manual_seed(0)
    layer = ladder_torch.CausalSelfAttention(32, 4, dtype=torch.float64)
    x = torch.randn(2, 11, 32, dtype=torch.float64, requires_grad=True)
    (g_eager,) = torch.autograd.grad(layer(x).square().sum(), x)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    assert ref.max_err(y, layer(x)) < 1e-12 and ref.max_err(g, g_eager) < 1e-12


def _tiny_training(attn, steps=8, seed=0):
    """A 2-layer causal transformer in float64, trained `steps` AdamW steps on one fixed batch of
    random tokens (which it learns to recite); the per-step losses."""
    torch.manual_seed(seed)
    vocab, t, c, heads = 17, 12, 32, 4

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(c, dtype=torch.float64)
            self.attn = ladder_torch.CausalSelfAttention(c, heads, rung=0, dtype=torch.float64)

        def forward(self, x):
            return x + self.attn(self.ln(x))

    emb = torch.nn.Embedding(vocab, c, dtype=torch.float64)
    blocks = torch.nn.Sequential(Block(), Block())
    head = torch.nn.Linear(c, vocab, dtype=torch.float64)
    params = [*emb.parameters(), *blocks.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (4, t + 1), generator=gen)
    losses = []
    for step in range(steps):
        x, y = data[:, :-1], data[:, 1:]
        with attn():
            loss = F.cross_entropy(head(blocks(emb(x))).view(-1, vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class _Sdpa:
    """Swaps attention() for SDPA inside the block (same weights, same batches)."""

    def __enter__(self):
        self.saved = ladder_torch.nn.attention
        ladder_torch.nn.attention = lambda q, k, v, causal, rung, dropout_p: (
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p)
        )

    def __exit__(self, *exc):
        ladder_torch.nn.attention = self.saved


class _Ladder:
    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_in_float64_follows_sdpa_step_by_step(seed):
    ours = _tiny_training(_Ladder, seed=seed)
    theirs = _tiny_training(_Sdpa, seed=seed)
    assert ours[-1] < ours[0]  # it learns
    # float64 on both sides: the losses differ by rounding only (about 1e-15); dQ off by a factor
    # 1 + 1e-4 moves them by about 5e-8 within these 8 AdamW steps
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1e-10


def test_gpt_smoke_run_on_the_cpu(tmp_path):
    env = dict(os.environ)
    cmd = [
        sys.executable,
        str(PYTHON_DIR / "train_gpt.py"),
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--attn",
        "sdpa",
        "rung0",
        "--steps",
        "3",
        "--batch",
        "2",
        "--context",
        "16",
        "--layers",
        "1",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--eval-batches",
        "1",
        "--out",
        str(tmp_path),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    for attn in ("sdpa", "rung0"):
        assert (tmp_path / f"{attn}.csv").is_file() and (tmp_path / f"{attn}.json").is_file()
    assert math.isfinite(float((tmp_path / "rung0.csv").read_text().splitlines()[-1].split(",")[1]))
