"""The CUDA library, where it was built (PyTorch with CUDA and nvcc at install time; no GPU
needed): it holds every GPU rung of the table, each instantiation with its backward, dropout and
block masks, its two listings (the text for messages, the rows the checks read) agree, and so do
the registry and the rungs' table on the facts the fake implementation reads (lse_lo, strides)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import ladder_torch  # noqa: E402
from ladder_torch import RUNGS, _native  # noqa: E402

NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.mark.skipif(
    _native.why_unavailable("cuda") is not None,
    reason=f"the CUDA library is not installed: {_native.why_unavailable('cuda')}",
)
def test_cuda_library_holds_every_gpu_rung_and_its_listings_agree():
    listing = torch.ops.ladder.cuda_kernels()
    for row in RUNGS.values():
        if row.device != "cuda":
            continue
        caps = _native.capabilities(row.number)
        assert caps, f"rung {row.number} missing from the CUDA library: {listing}"
        line = next((x for x in listing.splitlines() if x.startswith(f"rung {row.number}:")), "")
        for dtype, dims in caps.items():
            assert all(dims.values()), f"rung {row.number} {dtype}: a dim without backward"
            assert f"{NAMES[dtype]} d=" + " ".join(map(str, sorted(dims))) in line, listing
        assert "not available" not in ladder_torch.describe(row.number)
        for dtype, dims in caps.items():
            for dim in dims:
                f = _native.features(row.number, dtype, dim)
                assert f.dropout and f.mask_block is not None, (row.number, dtype, dim)
                assert f.strides == row.strides, (row.number, dtype, dim)
        lse_lo = {int(x.split()[4]) for x in torch.ops.ladder.cuda_capabilities().splitlines()
                  if int(x.split()[0]) == row.number}
        assert lse_lo == {int(row.lse_lo)}, row.number


def test_the_cpu_library_holds_rung0_for_any_head_dim():
    caps = _native.capabilities(0)
    assert set(caps) == {torch.float64, torch.float32}
    assert all(dims == {0: True} for dims in caps.values())
    f = _native.features(0, torch.float64, 80)
    assert f == _native.Features(True, RUNGS[0].strides, True, (1, 1))
