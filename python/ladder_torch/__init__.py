"""The attention ladder's rungs as PyTorch operators.

    from ladder_torch import ladder_attention
    out = ladder_attention(q, k, v, causal=True, rung=6)   # q, k, v: [B, H, N, d] as for SDPA

See ops.ladder_attention for the arguments, rungs.RUNGS for what each rung takes, and
build.py for how the C++/CUDA side is built (on first use, into build-python/).
"""

from .build import ExtensionUnavailable, load
from .ops import available_rungs, ladder_attention
from .rungs import RUNGS, Rung

__all__ = ["ExtensionUnavailable", "RUNGS", "Rung", "available_rungs", "ladder_attention", "load"]
