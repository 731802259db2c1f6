"""The attention ladder's rungs as PyTorch operators.

    import ladder_torch
    out = ladder_torch.attention(q, k, v, causal=True, rung=7)  # q, k, v: [B, H, N, d] as SDPA's
    out = ladder_torch.attention(q, k, v, dropout_p=0.1, block_mask=blocks, mask_block=128)
    layer = ladder_torch.ScaledDotProductAttention(causal=True)  # a module in its place

attention() mirrors torch.nn.functional.scaled_dot_product_attention; describe(rung) and
available_rungs() say what each rung takes in this installation (read from the compiled
libraries, which importing the package loads).
"""

import os

from . import _native
from ._native import ExtensionUnavailable
from .nn import CausalSelfAttention, ScaledDotProductAttention
from .ops import attention, available_rungs, describe, ladder_attention
from .rungs import RUNGS, Rung

# LADDER_TORCH_NO_AUTOLOAD=1 leaves the loading to _native.load(kind) (test_libraries.py loads
# the two libraries in a chosen order).
if os.environ.get("LADDER_TORCH_NO_AUTOLOAD", "") in ("", "0"):
    _native.load_installed()

__all__ = [
    "RUNGS",
    "CausalSelfAttention",
    "ExtensionUnavailable",
    "Rung",
    "ScaledDotProductAttention",
    "attention",
    "available_rungs",
    "describe",
    "ladder_attention",
]
