#!/usr/bin/env python3
"""Builds the package's libraries offline, for a machine without package access.

    python3 python/build_ext.py            # then: PYTHONPATH=python/src (or pip-installed: nothing)
    python3 python/build_ext.py --inplace  # always the in-place build

Where the environment can build a wheel without the network (the `wheel` package, or
setuptools 70.1 or later, which has bdist_wheel itself), this is `pip install
--no-build-isolation --no-deps ./python`: an ordinary installation, against the PyTorch already
installed. Otherwise (a Debian venv seeds setuptools 66 without `wheel`, and PyTorch's
`setuptools<82` leaves it there) it is `setup.py build_ext --inplace`: the libraries are built
into python/src/ladder_torch/, and python/src goes on PYTHONPATH. MAX_JOBS caps the compiler
jobs; LADDER_TORCH_CUDA=0 skips the CUDA library. Prints what the libraries hold.

Exit status: the build's, or 1 if the package then does not import.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def can_build_wheels() -> bool:
    if importlib.util.find_spec("wheel") is not None:
        return True
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)


def main() -> int:
    inplace = "--inplace" in sys.argv[1:] or not can_build_wheels()
    env = dict(os.environ)
    if inplace:
        cmd = [sys.executable, "setup.py", "build_ext", "--inplace"]
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "src"), env.get("PYTHONPATH", "")])
    else:
        cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "."]
    print(f"({HERE}) " + " ".join(cmd), flush=True)
    status = subprocess.call(cmd, cwd=HERE)
    if status:
        return status
    show = (
        "import ladder_torch; print(ladder_torch.__file__); "
        "print(*ladder_torch.available_rungs(), sep='\\n')"
    )
    if subprocess.call([sys.executable, "-c", show], cwd="/", env=env):
        return 1
    if inplace:
        print(f"built in place: put {HERE / 'src'} on PYTHONPATH to import it", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
