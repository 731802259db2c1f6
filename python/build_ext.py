#!/usr/bin/env python3
"""Builds the ladder's PyTorch extension ahead of its first use (into build-python/).

    python3 python/build_ext.py            # the CUDA rungs (needs nvcc) and rung 0 (needs Eigen)
    python3 python/build_ext.py cuda       # the CUDA rungs only: all that training needs
    python3 python/build_ext.py cpu        # rung 0 only: builds without CUDA

Prints where each library was built and, for CUDA, every (rung, dtype, head dim) it holds.
With both, the CPU library compiles in a child process beside the CUDA one, then this process
loads the two. Exit status 1 if a build failed (the message says why), 2 for a bad argument.
"""

import faulthandler
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ladder_torch.build import main  # noqa: E402

if __name__ == "__main__":
    faulthandler.enable()  # a crash in native code prints the Python stack that led to it
    kinds = sys.argv[1:] or ["cuda", "cpu"]
    if any(k not in ("cpu", "cuda") or k.startswith("-") for k in kinds):
        print(__doc__.strip(), file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(kinds))
