"""The rungs PyTorch can call: one row per rung, and nothing else knows the list.

A row says what the rung takes (device, dtypes, head dims, backward) and how to build it
(its adaptor sources under python/csrc, its kernel headers or kernel files, the GPU
architecture). The
operator's checks, its fake implementation (for torch.compile) and the build all read this
table; the adaptor registers the compiled kernels with the C++ side, which checks them again.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Rung:
    number: int
    name: str  # the step's folder under steps/
    device: str  # "cpu" or "cuda"
    dtypes: tuple[torch.dtype, ...]
    dims: tuple[int, ...] | None  # forward head dims; None: any
    backward_dims: tuple[int, ...] | None  # () : forward only; None: any
    sources: tuple[str, ...] = ()  # adaptors in python/csrc, compiled into the CUDA extension
    include_dirs: tuple[str, ...] = ()  # the rung's kernel headers, relative to the repository
    # The rung's own kernel files (relative to the repository), compiled into the CUDA extension
    # as they are, for a rung whose kernels live in .cu files rather than headers.
    kernel_sources: tuple[str, ...] = ()
    lse_lo: bool = False  # keeps LSE's rounding residual for its backward (a third output)
    arch: str = "sm_90"  # the CUDA target its kernels need; sm_90a for wgmma and TMA

    def has_backward(self, dim: int) -> bool:
        return self.backward_dims is None or dim in self.backward_dims

    def takes_dim(self, dim: int) -> bool:
        return self.dims is None or dim in self.dims

    def describe(self) -> str:
        dtypes = ", ".join(str(t).replace("torch.", "") for t in self.dtypes)
        dims = "any" if self.dims is None else " ".join(map(str, self.dims))
        if self.backward_dims is None:
            bwd = "any d"
        elif self.backward_dims:
            bwd = "d " + " ".join(map(str, self.backward_dims))
        else:
            bwd = "none"
        return (
            f"rung {self.number} ({self.name}, {self.device}): {dtypes}; d {dims}; backward {bwd}"
        )


RUNGS: dict[int, Rung] = {
    r.number: r
    for r in (
        Rung(0, "00_cpu_reference", "cpu", (torch.float64, torch.float32), None, None),
        Rung(
            5,
            "05_shared_memory_fa2",
            "cuda",
            (torch.float32,),
            (64, 128),
            (64, 128),
            sources=("rung05.cu",),
            include_dirs=("steps/05_shared_memory_fa2",),
            lse_lo=True,
        ),
        Rung(
            6,
            "06_tensor_core_fa2",
            "cuda",
            (torch.bfloat16, torch.float16),
            (32, 64, 96, 128),
            (32, 64, 96, 128),
            sources=("rung06_d32.cu", "rung06_d64.cu", "rung06_d96.cu", "rung06_d128.cu"),
            include_dirs=("steps/06_tensor_core_fa2",),
        ),
        Rung(
            7,
            "07_wgmma_tma_fa3",
            "cuda",
            (torch.bfloat16, torch.float16),
            (64, 128),
            (64, 128),
            sources=("rung07.cpp",),
            include_dirs=("steps/07_wgmma_tma_fa3",),
            kernel_sources=(
                "steps/07_wgmma_tma_fa3/wgmma_tma_fa3.cu",
                "steps/07_wgmma_tma_fa3/wgmma_tma_fa3_backward.cu",
            ),
            arch="sm_90a",  # wgmma, TMA and setmaxnreg: the whole library is then sm_90a
        ),
    )
}


def rung(number: int) -> Rung:
    """The row of rung `number`, or a ValueError that lists the rungs there are."""
    if isinstance(number, bool) or not isinstance(number, int) or number not in RUNGS:
        known = "; ".join(r.describe() for r in RUNGS.values())
        raise ValueError(f"ladder: no rung {number!r} in the PyTorch extension. Rungs: {known}")
    return RUNGS[number]
