"""pytest setup: a header line that says which ladder_torch runs and what it holds. The tests
import the installed package (`pip install ./python`), not the source folder."""


def pytest_report_header(config):
    try:
        import torch
    except ImportError:
        return "ladder_torch: PyTorch is not installed: every test is skipped"
    try:
        import ladder_torch
    except ImportError as e:
        return f"ladder_torch: not importable ({e}): install it with pip install ./python"
    where = f"ladder_torch from {ladder_torch.__file__}"
    rungs = "\n  ".join(ladder_torch.available_rungs())
    if not torch.cuda.is_available():
        device = f"torch {torch.__version__}, no CUDA device: GPU tests are skipped"
    else:
        name = torch.cuda.get_device_name()
        device = f"torch {torch.__version__} (CUDA {torch.version.cuda}), {name}"
    return f"{where}\n{device}\n  {rungs}"
