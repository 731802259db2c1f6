"""Builds ladder_torch's two libraries with torch's own extension machinery (BuildExtension,
ninja) when the package is installed from the repository: `pip install ./python`.

  _ladder_cpu   rung 0, the float64 oracle: csrc/ops_cpu.cpp with reference/oracle.cpp and
                common/tensor.cpp, dtype.cpp. Needs Eigen (LADDER_EIGEN_INCLUDE, else the
                repository's .deps/include/eigen3, else /usr/include/eigen3). Always built.
  _ladder_cuda  the GPU rungs: csrc/ops_cuda.cpp (g++, torch headers) and each rung's adaptor
                (nvcc for a .cu that instantiates the rung's kernel headers, no torch headers;
                rung 06's split into parts that ninja compiles in parallel), plus rung 07's
                kernel files, for the architecture the rungs' rows name (sm_90a). Built where
                PyTorch has CUDA and nvcc is found; LADDER_TORCH_CUDA=0 skips it, =1 insists.

The sources outside python/ are read from the repository in place (pip builds a local folder
in place), so the package installs from a checkout, not from an sdist. MAX_JOBS caps ninja.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CSRC = HERE / "csrc"


def rel(path: Path) -> str:
    """A source path as setuptools wants it: relative to this folder ('../steps/...' for the
    repository's own files; their objects land under build/, beside the others)."""
    return os.path.relpath(path, HERE)


def import_torch():
    """torch from the environment being installed into. Under pip's build isolation that
    environment's site-packages are hidden from this process (which runs its interpreter), so
    they are put back at the end of the path: an extension compiled against any other torch
    would not load in it."""
    try:
        import torch
    except ImportError:
        paths = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
        paths.append(site.getusersitepackages())
        sys.path.extend(p for p in paths if p not in sys.path)
        try:
            import torch
        except ImportError:
            raise SystemExit(
                "ladder_torch: PyTorch is not installed in this environment; install torch first "
                "(the extension is compiled against it)"
            ) from None
    return torch


def rungs_table():
    """RUNGS from src/ladder_torch/rungs.py, read without importing the package."""
    spec = importlib.util.spec_from_file_location(
        "ladder_rungs", HERE / "src/ladder_torch/rungs.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module.RUNGS


def eigen_include() -> str:
    candidates = [os.environ.get("LADDER_EIGEN_INCLUDE", "")]
    candidates += [str(REPO / ".deps" / "include" / "eigen3"), "/usr/include/eigen3"]
    for c in candidates:
        if c and (Path(c) / "Eigen" / "Dense").is_file():
            return c
    raise SystemExit(
        "ladder_torch: Eigen not found (rung 0, the oracle, needs it): install libeigen3-dev, "
        "stage it with tools/stage-deps.sh .deps, or set LADDER_EIGEN_INCLUDE to the folder "
        "that holds Eigen/Dense"
    )


# Every compilation: warnings on, and no symbol visible outside its library (exports.map
# removes what the headers mark visible, such as PyTorch's classes' vtables).
CXX_FLAGS = ["-O2", "-Wall", "-Wextra", "-fvisibility=hidden", "-fvisibility-inlines-hidden"]
LD_FLAGS = [f"-Wl,--version-script={CSRC / 'exports.map'}"]


def extensions(torch):
    from torch.utils import cpp_extension

    # PyTorch's headers as system headers: setuptools passes them with -I, where -Wextra warns
    # about their unused parameters; a directory given with -isystem too is searched as a system
    # one (GCC ignores the -I), so the warnings that remain are this project's.
    system = [f for p in cpp_extension.include_paths() for f in ("-isystem", p)]
    ext = [
        cpp_extension.CppExtension(
            "ladder_torch._ladder_cpu",
            sources=[
                rel(CSRC / "ops_cpu.cpp"),
                rel(REPO / "reference" / "oracle.cpp"),
                rel(REPO / "common" / "tensor.cpp"),
                rel(REPO / "common" / "dtype.cpp"),
            ],
            include_dirs=[str(REPO / "common"), str(REPO / "reference"), eigen_include()],
            extra_compile_args=CXX_FLAGS + system,
            extra_link_args=LD_FLAGS,
        )
    ]
    want = os.environ.get("LADDER_TORCH_CUDA", "")
    have = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if want == "1" and not have:
        raise SystemExit(
            "ladder_torch: LADDER_TORCH_CUDA=1 but "
            + ("this PyTorch has no CUDA" if torch.version.cuda is None else "no nvcc (CUDA_HOME)")
        )
    if want == "0" or not have:
        print("ladder_torch: building the CPU library only (rung 0)", flush=True)
        return ext
    rows = [r for r in rungs_table().values() if r.device == "cuda"]
    # One -gencode for every architecture the rows name: sm_90a replaces sm_90 (it runs the
    # sm_90 kernels too, on the H100 only).
    arch = "90a" if any(r.arch == "sm_90a" for r in rows) else "90"
    sources = [rel(CSRC / "ops_cuda.cpp")] + [rel(CSRC / s) for r in rows for s in r.sources]
    sources += [rel(REPO / s) for r in rows for s in r.kernel_sources]
    includes = [str(CSRC), str(REPO / "common"), str(REPO / "steps")]
    includes += [str(REPO / d) for r in rows for d in r.include_dirs]
    ext.append(
        cpp_extension.CUDAExtension(
            "ladder_torch._ladder_cuda",
            sources=sources,
            include_dirs=includes,
            extra_compile_args={
                "cxx": CXX_FLAGS + system,
                "nvcc": [
                    "-O3",
                    "--expt-relaxed-constexpr",
                    "-Xcompiler=" + ",".join(f for f in CXX_FLAGS if f != "-O2"),
                    # PyTorch compiles extensions without cuda_fp16.h's and cuda_bf16.h's
                    # operators and conversions; the kernels are written (and their SASS
                    # checked) with them, as the ladder's own build compiles them.
                    "-U__CUDA_NO_HALF_OPERATORS__",
                    "-U__CUDA_NO_HALF_CONVERSIONS__",
                    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                    "-U__CUDA_NO_HALF2_OPERATORS__",
                    f"-gencode=arch=compute_{arch},code=sm_{arch}",
                ],
            },
            extra_link_args=LD_FLAGS,
        )
    )
    return ext


torch = import_torch()
from torch.utils.cpp_extension import BuildExtension  # noqa: E402

setup(
    ext_modules=extensions(torch),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
