"""The two libraries (cpu: rung 0 with Eigen; cuda: the GPU rungs) in one process, in either
order: each registers its kernels, the CPU operator still computes, and the process exits
cleanly. And neither library exports a symbol: PyTorch loads them with RTLD_GLOBAL, where an
exported definition takes the place of the same name in every library loaded after it. Needs the
CUDA library installed (built where nvcc was found), not a GPU."""

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from ladder_torch import _native  # noqa: E402

pytestmark = pytest.mark.skipif(
    _native.why_unavailable("cuda") is not None,
    reason=f"the CUDA library is not installed: {_native.why_unavailable('cuda')}",
)

# Loads the libraries in the order given, then checks what each registered. Run in a fresh
# interpreter per order, so that the order is the real one and a crash at exit shows too.
SCRIPT = """
import faulthandler, sys
faulthandler.enable()
import torch
from ladder_torch import _native  # LADDER_TORCH_NO_AUTOLOAD=1: nothing loaded yet
assert not _native._loaded
for kind in sys.argv[1:]:
    _native.load(kind)
    print("loaded", kind, flush=True)
print(torch.ops.ladder.cuda_kernels().replace("\\n", "; "), flush=True)
q = torch.linspace(-1, 1, 2 * 3 * 5 * 8, dtype=torch.float64).view(2, 3, 5, 8)
out, lse, _ = torch.ops.ladder.fwd(q, q.flip(2), q, True, 0.5, 0)
assert out.shape == q.shape and lse.shape == (2, 3, 5) and torch.isfinite(out).all()
try:
    torch.ops.ladder.fwd(q, q, q, False, 0.5, 6)  # rung 6 on CPU tensors: a clean error
    raise SystemExit("rung 6 accepted CPU tensors")
except NotImplementedError as e:
    assert "CUDA tensors" in str(e), e
print("ok", flush=True)
"""


@pytest.fixture(scope="module")
def libraries():
    """Both libraries' files (this process loaded them at import)."""
    return {kind: _native.load(kind) for kind in ("cpu", "cuda")}


@pytest.mark.parametrize("order", [("cuda", "cpu"), ("cpu", "cuda")], ids="-then-".join)
@pytest.mark.usefixtures("libraries")
def test_both_libraries_in_one_process(order):
    env = dict(os.environ, LADDER_TORCH_NO_AUTOLOAD="1")
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, *order],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"exit status {run.returncode}:\n{log}"
    lines = run.stdout.splitlines()
    assert lines[:2] == [f"loaded {order[0]}", f"loaded {order[1]}"], log
    assert "rung 6: bf16" in lines[2] and lines[-1] == "ok", log


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) not found")
def test_the_libraries_export_no_symbol(libraries):
    for kind, path in libraries.items():
        listing = subprocess.run(
            ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
        ).stdout
        # What a shared library defines in its dynamic symbol table besides code: none here.
        exported = [line.split()[-1] for line in listing.splitlines() if line.strip()]
        assert exported == [], f"{kind} library exports {len(exported)} symbols: {exported[:10]}"
