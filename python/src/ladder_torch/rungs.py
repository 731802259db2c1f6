"""The rungs PyTorch can call, and how each is built: one row per rung.

A row says where the rung runs and how its library is compiled (its adaptor sources under
python/csrc, its kernel headers or kernel files, the GPU architecture), and the two facts the
fake implementation needs without a library (lse_lo, strides). What a rung *takes* (dtypes, head
dims, which have a backward, strided tensors, dropout, mask blocks) is not here: the compiled
libraries report the instantiations they hold (torch.ops.ladder.cpu_capabilities /
cuda_capabilities, read by _native.capabilities() and _native.features()), and the checks read
that, so there is no second list to keep in step.

Plain data with no torch import: setup.py reads this file to know what to compile.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Rung:
    number: int
    name: str  # the step's folder under steps/
    device: str  # "cpu" or "cuda"
    sources: tuple[str, ...] = ()  # adaptors in python/csrc, compiled into the CUDA library
    include_dirs: tuple[str, ...] = ()  # the rung's kernel headers, relative to the repository
    # The rung's own kernel files (relative to the repository), compiled into the CUDA library
    # as they are, for a rung whose kernels live in .cu files rather than headers.
    kernel_sources: tuple[str, ...] = ()
    # Keeps LSE's rounding residual for its backward: the operator's third output is then
    # [B, H, M] instead of an empty [0] (the fake implementation needs to know without running).
    lse_lo: bool = False
    # Writes O through strides: the operator's O then follows q's layout (SDPA's flash rule,
    # _schema.out_like), which the fake implementation needs to know without running. The
    # library's registry says the same (its `strides` column; test_build.py holds them equal).
    strides: bool = False
    arch: str = "sm_90"  # the CUDA target its kernels need; sm_90a for wgmma and TMA


RUNGS: dict[int, Rung] = {
    r.number: r
    for r in (
        Rung(0, "00_cpu_reference", "cpu"),
        Rung(
            5,
            "05_shared_memory_fa2",
            "cuda",
            sources=("rung05.cu",),
            include_dirs=("steps/05_shared_memory_fa2",),
            lse_lo=True,
        ),
        Rung(
            6,
            "06_tensor_core_fa2",
            "cuda",
            # rung06.cuh's parts, compiled in parallel
            sources=tuple(f"rung06_part{i}.cu" for i in range(4)),
            include_dirs=("steps/06_tensor_core_fa2",),
        ),
        Rung(
            7,
            "07_wgmma_tma_fa3",
            "cuda",
            sources=("rung07.cpp",),
            include_dirs=("steps/07_wgmma_tma_fa3",),
            kernel_sources=(
                "steps/07_wgmma_tma_fa3/wgmma_tma_fa3.cu",
                "steps/07_wgmma_tma_fa3/wgmma_tma_fa3_backward.cu",
            ),
            strides=True,
            arch="sm_90a",  # wgmma, TMA and setmaxnreg: the whole library is then sm_90a
        ),
    )
}


def rung(number) -> Rung:
    """The row of rung `number`, or a ValueError that lists the rungs there are."""
    if isinstance(number, bool) or not isinstance(number, int) or number not in RUNGS:
        known = ", ".join(f"{r.number} ({r.name}, {r.device})" for r in RUNGS.values())
        raise ValueError(f"ladder: no rung {number!r}; the rungs are {known}")
    return RUNGS[number]
