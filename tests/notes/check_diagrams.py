#!/usr/bin/env python3
"""notes.diagrams: every concept diagram in notes/*.md is the one tools/diagrams.py draws from
the code's current constants (tile sizes, threads per block, head dims).

  check_diagrams.py [ROOT]     name each stale or unknown diagram block; exit 1 if there is one
"""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("diagrams", ROOT / "tools" / "diagrams.py")
diagrams = importlib.util.module_from_spec(spec)
spec.loader.exec_module(diagrams)
sys.exit(diagrams.main([str(ROOT), "--check"]))
