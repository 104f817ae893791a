"""Launch helpers shared by the Triton ops."""
from __future__ import annotations

import functools

import torch
import triton


def pow2(x: int, lo: int = 16) -> int:
    """The next power of two >= x, at least lo (tile sizes)."""
    return max(lo, triton.next_power_of_2(int(x)))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (asked once per device: the launches are per layer);
    4 stands in for the interpreter."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
