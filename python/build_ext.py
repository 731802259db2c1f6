#!/usr/bin/env python3
"""Installs the package into this interpreter's environment, as `pip install ./python` does, but
offline: `--no-build-isolation` (the torch already installed is the one to compile against, and
setuptools comes with it) and `--no-deps`. Then prints what the installed libraries hold.

    python3 python/build_ext.py   # MAX_JOBS caps the compiler jobs; LADDER_TORCH_CUDA=0 skips CUDA

Exit status: pip's, or 1 if the installed package does not import.
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", str(HERE)]
    print(" ".join(cmd), flush=True)
    status = subprocess.call(cmd)
    if status:
        raise SystemExit(status)
    show = "import ladder_torch; print(*ladder_torch.available_rungs(), sep='\\n')"
    raise SystemExit(1 if subprocess.call([sys.executable, "-c", show], cwd="/") else 0)
