"""The CUDA extension builds (nvcc, no GPU needed) and holds exactly the instantiations that
the rungs' table in ladder_torch/rungs.py promises."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from torch.utils import cpp_extension  # noqa: E402

from ladder_torch import RUNGS, load  # noqa: E402

NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@pytest.mark.skipif(torch.version.cuda is None, reason="this PyTorch is built without CUDA")
@pytest.mark.skipif(cpp_extension.CUDA_HOME is None, reason="no CUDA toolkit (nvcc) found")
def test_cuda_extension_holds_what_the_table_says():
    load("cuda")
    listing = torch.ops.ladder.cuda_kernels()
    for row in RUNGS.values():
        if row.device != "cuda":
            continue
        line = next((x for x in listing.splitlines() if x.startswith(f"rung {row.number}:")), "")
        for dtype in row.dtypes:
            entry = f"{NAMES[dtype]}{'' if row.backward_dims else ' (forward only)'} d="
            assert entry + " ".join(map(str, row.dims)) in line, (row.number, dtype, listing)
