"""pytest setup: ladder_torch importable from python/, and a header line that says what runs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_report_header(config):
    try:
        import torch
    except ImportError:
        return "ladder_torch: PyTorch is not installed: every test is skipped"
    if not torch.cuda.is_available():
        return f"ladder_torch: torch {torch.__version__}, no CUDA device: GPU tests are skipped"
    name = torch.cuda.get_device_name()
    return f"ladder_torch: torch {torch.__version__} (CUDA {torch.version.cuda}), {name}"
