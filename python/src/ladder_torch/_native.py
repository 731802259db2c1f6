"""Loads the compiled libraries behind the ladder:: operators and reads what they hold.

`pip install ./python` compiles them (setup.py, with torch's own extension machinery) into the
package: _ladder_cpu (rung 0, the float64 oracle; always built) and _ladder_cuda (the GPU
rungs; built where PyTorch has CUDA and nvcc is found). Importing ladder_torch loads both that
exist, so their TORCH_LIBRARY_IMPL blocks register the CPU and CUDA kernels of ladder::fwd and
ladder::bwd before any call, and torch.compile never meets an operator without a kernel.

Both libraries are compiled with hidden visibility and linked with csrc/exports.map, so they
export no symbol: loaded into one process (with RTLD_GLOBAL, as torch.ops.load_library does),
neither can bind the other's calls to its own copies of shared template code.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import torch

from . import _schema  # noqa: F401  the schemas first: the libraries only add kernels

HERE = Path(__file__).resolve().parent
KINDS = ("cpu", "cuda")


class ExtensionUnavailable(RuntimeError):
    """A library a rung needs is not installed or does not load here (the message says why)."""


_lock = threading.Lock()
_loaded: dict[str, Path] = {}  # kind -> library file
_failed: dict[str, str] = {}  # kind -> why (not retried within a process)
_caps: dict[int, dict[torch.dtype, dict[int, bool]]] = {}  # rung -> dtype -> dim -> backward


@dataclasses.dataclass(frozen=True)
class Features:
    """What one compiled instantiation takes beyond its dtype and head dim (its library's
    registry: the adaptor fills it from the step's tables)."""

    backward: bool
    strides: bool  # reads strided q, k, v, out, dO in place (else the operator copies them)
    dropout: bool
    mask_block: tuple[int, int] | None  # block masks of multiples of these; None: no block masks


_features: dict[int, dict[torch.dtype, dict[int, Features]]] = {}  # rung -> dtype -> dim -> ...

_DTYPES = {"float64": torch.float64, "float32": torch.float32}
_DTYPES.update(float16=torch.float16, bfloat16=torch.bfloat16)


def library_file(kind: str) -> Path | None:
    """The installed library of `kind`, or None."""
    found = sorted(HERE.glob(f"_ladder_{kind}*.so"))
    return found[0] if found else None


def _why_missing(kind: str) -> str:
    if kind == "cpu":
        return (
            "ladder: the CPU library (rung 0) is not installed next to ladder_torch "
            f"({HERE}); install the package with `pip install ./python` from the repository"
        )
    return (
        "ladder: the CUDA library (rungs 5, 6, 7) is not in this installation: `pip install "
        "./python` builds it where PyTorch has CUDA and nvcc is found (and LADDER_TORCH_CUDA is "
        "not 0)"
    )


def _read_capabilities(kind: str) -> None:
    text = getattr(torch.ops.ladder, f"{kind}_capabilities")()
    for line in text.splitlines():
        number, dtype, dim, backward, _lse_lo, strides, dropout, block_q, block_k = line.split()
        rung, dim, dtype = int(number), int(dim), _DTYPES[dtype]
        _caps.setdefault(rung, {}).setdefault(dtype, {})[dim] = backward == "1"
        mask_block = (int(block_q), int(block_k)) if int(block_q) > 0 else None
        _features.setdefault(rung, {}).setdefault(dtype, {})[dim] = Features(
            backward == "1", strides == "1", dropout == "1", mask_block
        )


def load(kind: str) -> Path:
    """Loads the 'cpu' or 'cuda' library once per process; returns its file. Raises
    ExtensionUnavailable, with the reason, when it cannot."""
    if kind not in KINDS:
        raise ValueError(f"ladder: no library {kind!r} ({', '.join(KINDS)})")
    with _lock:
        if kind in _loaded:
            return _loaded[kind]
        if kind in _failed:
            raise ExtensionUnavailable(_failed[kind])
        path = library_file(kind)
        try:
            if path is None:
                raise ExtensionUnavailable(_why_missing(kind))
            torch.ops.load_library(str(path))
            _read_capabilities(kind)
        except ExtensionUnavailable as e:
            _failed[kind] = str(e)
            raise
        except Exception as e:  # a library that does not load: keep its message
            _failed[kind] = f"ladder: loading {path} failed: {e}"
            raise ExtensionUnavailable(_failed[kind]) from e
        _loaded[kind] = path
        return path


def load_installed() -> None:
    """Loads every library that is installed (at import); a missing one raises on use."""
    for kind in KINDS:
        try:
            load(kind)
        except ExtensionUnavailable:
            pass


def capabilities(number: int) -> dict[torch.dtype, dict[int, bool]]:
    """What the loaded libraries hold for rung `number`: dtype -> head dim (0: any) -> whether
    it has a backward. Empty when the rung's library is not loaded."""
    return _caps.get(number, {})


def features(number: int, dtype: torch.dtype, dim: int) -> Features | None:
    """What rung `number` takes at (dtype, head dim), or None where it has no such instantiation
    (or its library is not loaded)."""
    dims = _features.get(number, {}).get(dtype, {})
    return dims.get(dim, dims.get(0))


def why_unavailable(kind: str) -> str | None:
    """None if the library of `kind` is loaded, else why not."""
    return None if kind in _loaded else _failed.get(kind, _why_missing(kind))
