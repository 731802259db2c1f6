"""Builds and loads the two shared libraries behind the ladder:: operators.

torch.utils.cpp_extension.load() compiles them with ninja into build-python/ at the repository
root (LADDER_TORCH_BUILD overrides it) and loads them into the process, where their
TORCH_LIBRARY_IMPL blocks register the CPU and CUDA implementations of ladder::fwd and
ladder::bwd. load() rather than a setup.py: nothing to install, the build lives beside the
ladder's own build/, it is redone only when a source or a flag changes (ninja), and a learner
edits a kernel header and reruns. The two libraries:

  cpu   rung 0, the float64 oracle: ops_cpu.cpp with reference/oracle.cpp and common/tensor.cpp,
        dtype.cpp; needs Eigen (LADDER_EIGEN_INCLUDE, else .deps/include/eigen3, else
        /usr/include/eigen3). g++ only: builds where there is no CUDA.
  cuda  the GPU rungs: ops_cuda.cpp (g++, torch headers) and each rung's adaptor (nvcc for a
        .cu that instantiates the rung's kernel headers, no torch headers; one file per head
        dim so that ninja compiles them in parallel), plus the kernel files of a rung that has
        them (rung 07's), for the architecture the rungs' rows in rungs.py name (sm_90a as soon
        as one row needs it).

Both libraries are compiled with hidden visibility and linked with csrc/exports.map, so they
export no symbol: loaded into one process (with RTLD_GLOBAL, as torch.ops.load_library does),
neither can bind the other's calls to its own copies of shared template code.

LADDER_TORCH_VERBOSE=1 prints the compiler command lines; MAX_JOBS caps ninja's parallelism.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from .rungs import RUNGS

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "python" / "csrc"


class ExtensionUnavailable(RuntimeError):
    """The extension a rung needs could not be built or loaded here (the message says why)."""


_lock = threading.Lock()
_loaded: dict[str, str] = {}  # kind -> library path
_failed: dict[str, str] = {}  # kind -> why (not retried within a process)


def build_root() -> Path:
    return Path(os.environ.get("LADDER_TORCH_BUILD", REPO / "build-python"))


def _verbose() -> bool:
    return os.environ.get("LADDER_TORCH_VERBOSE", "") not in ("", "0")


def eigen_include() -> Path:
    candidates = [os.environ.get("LADDER_EIGEN_INCLUDE", "")]
    candidates += [str(REPO / ".deps" / "include" / "eigen3"), "/usr/include/eigen3"]
    for c in candidates:
        if c and (Path(c) / "Eigen" / "Dense").is_file():
            return Path(c)
    raise ExtensionUnavailable(
        "ladder: Eigen not found (rung 0, the oracle, needs it): set LADDER_EIGEN_INCLUDE to the "
        "folder that holds Eigen/Dense, or stage it in .deps/include/eigen3"
    )


# Every compilation: warnings on, and no symbol visible outside its library (exports.map
# removes what the headers mark visible, such as PyTorch's classes' vtables).
CXX_FLAGS = ["-O2", "-Wall", "-Wextra", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
LD_FLAGS = [f"-Wl,--version-script={CSRC / 'exports.map'}"]


def _cpu_spec() -> dict:
    return dict(
        name="ladder_torch_cpu",
        sources=[
            CSRC / "ops_cpu.cpp",
            REPO / "reference" / "oracle.cpp",
            REPO / "common" / "tensor.cpp",
            REPO / "common" / "dtype.cpp",
        ],
        extra_include_paths=[REPO / "common", REPO / "reference", eigen_include()],
        extra_cflags=CXX_FLAGS,
        extra_ldflags=LD_FLAGS,
    )


def cuda_arch_flags() -> list[str]:
    """One -gencode per architecture the CUDA rungs' rows name (sm_90a replaces sm_90: it runs
    the sm_90 kernels too, on the H100 only)."""
    archs = {r.arch for r in RUNGS.values() if r.device == "cuda"}
    arch = "90a" if "sm_90a" in archs else "90"
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def _cuda_spec() -> dict:
    cuda_rungs = [r for r in RUNGS.values() if r.device == "cuda"]
    sources = [CSRC / "ops_cuda.cpp"] + [CSRC / s for r in cuda_rungs for s in r.sources]
    sources += [REPO / s for r in cuda_rungs for s in r.kernel_sources]
    includes = [CSRC, REPO / "common", REPO / "steps"]
    includes += [REPO / d for r in cuda_rungs for d in r.include_dirs]
    return dict(
        name="ladder_torch_cuda",
        sources=sources,
        extra_include_paths=includes,
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=[
            "-O3",
            "--expt-relaxed-constexpr",
            "-Xcompiler=" + ",".join(f for f in CXX_FLAGS if f != "-O2"),
            # PyTorch compiles extensions without cuda_fp16.h's and cuda_bf16.h's operators and
            # conversions; the kernels are written (and their SASS checked) with them, as the
            # ladder's own build compiles them.
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-U__CUDA_NO_HALF2_OPERATORS__",
            *cuda_arch_flags(),
        ],
        extra_ldflags=LD_FLAGS,
    )


def _load(kind: str) -> str:
    from torch.utils import cpp_extension

    spec = _cpu_spec() if kind == "cpu" else _cuda_spec()
    if kind == "cuda" and cpp_extension.CUDA_HOME is None:
        raise ExtensionUnavailable("ladder: no CUDA toolkit (nvcc) found: set CUDA_HOME")
    if kind == "cuda" and torch.version.cuda is None:
        raise ExtensionUnavailable("ladder: this PyTorch is built without CUDA")
    directory = build_root() / kind
    directory.mkdir(parents=True, exist_ok=True)
    spec["sources"] = [str(s) for s in spec["sources"]]
    spec["extra_include_paths"] = [str(p) for p in spec["extra_include_paths"]]
    start = time.perf_counter()
    cpp_extension.load(
        **spec,
        build_directory=str(directory),
        is_python_module=False,
        verbose=_verbose(),
    )
    if _verbose():
        print(f"ladder: {kind} extension ready in {time.perf_counter() - start:.1f} s")
    return str(directory)


def load(kind: str) -> str:
    """Builds (if needed) and loads the 'cpu' or 'cuda' library once per process; returns its
    build folder. Raises ExtensionUnavailable, with the reason, when it cannot."""
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"ladder: no extension {kind!r} (cpu, cuda)")
    with _lock:
        if kind in _loaded:
            return _loaded[kind]
        if kind in _failed:
            raise ExtensionUnavailable(_failed[kind])
        from . import ops  # noqa: F401  the schemas first: the libraries only add kernels

        try:
            _loaded[kind] = _load(kind)
        except ExtensionUnavailable as e:
            _failed[kind] = str(e)
            raise
        except Exception as e:  # a compiler error: keep its message, and do not retry
            _failed[kind] = f"ladder: building the {kind} extension failed: {e}"
            raise ExtensionUnavailable(_failed[kind]) from e
        return _loaded[kind]


def loaded(kind: str) -> bool:
    return kind in _loaded


def _build_in_child(kind: str) -> subprocess.Popen:
    """Builds (and loads, to check it) library `kind` in a child process, for main() to wait
    on: the two libraries share no object file, so they compile side by side."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")])
    code = f"import faulthandler; faulthandler.enable(); from ladder_torch.build import load; load({kind!r})"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def main(kinds: list[str]) -> int:
    """Builds ahead of time (python/build_ext.py), prints what was built; 1 if one failed.

    With both kinds, the CPU library compiles in a child process while this one compiles the
    CUDA library; then this process loads both, one after the other, as a test session does."""
    status = 0
    child = _build_in_child("cpu") if "cpu" in kinds and "cuda" in kinds else None
    for kind in sorted(kinds, key=lambda k: k != "cuda"):
        start = time.perf_counter()
        how = ""
        if kind == "cpu" and child is not None:
            log = child.communicate()[0]
            how = ", compiled beside cuda"
            if child.returncode != 0:  # load() below says why; the child's output may say more
                print(f"cpu: the child build exited {child.returncode}:\n{log}", file=sys.stderr)
        try:
            path = load(kind)
            print(f"{kind}: built in {path} ({time.perf_counter() - start:.1f} s{how})", flush=True)
            if kind == "cuda":
                print(torch.ops.ladder.cuda_kernels(), flush=True)
        except ExtensionUnavailable as e:
            print(f"{kind}: not built: {e}", flush=True)
            status = 1
    return status
