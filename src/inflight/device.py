"""Which device the book runs on, said once at the top of every chapter."""
from __future__ import annotations

import platform


def pick_device(device: str | None = None) -> str:
    """The device to use: the one asked for, else CUDA when present, else CPU."""
    if device is not None:
        return str(device)
    try:
        import torch
    except ImportError:  # the scheduling chapters work without torch
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def half_dtype(device=None):
    """The 16-bit dtype a GPU runs fast: bfloat16 from Ampere on (compute capability 8.0), float16
    before (T4, V100), where bfloat16 is only emulated and Triton's `tl.dot` lacks it; CPU: bfloat16."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return torch.bfloat16
    major, _minor = torch.cuda.get_device_capability(dev)
    return torch.bfloat16 if major >= 8 else torch.float16


def describe_device() -> str:
    """One line naming the accelerator (or CPU) this notebook runs on; printed by the setup cell."""
    try:
        import torch
    except ImportError:
        return f"CPU ({platform.processor() or platform.machine()}), torch not installed"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}"
    threads = torch.get_num_threads()
    return f"CPU ({platform.machine()}, {threads} threads), torch {torch.__version__} — no GPU: GPU sections are skipped"
