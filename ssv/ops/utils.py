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


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name(device: torch.device) -> str:
    """A CUDA device's name (tuned tile tables are keyed by it); "cpu" elsewhere."""
    return _device_name(_index(device)) if device.type == "cuda" else device.type


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (asked once per device: the launches are per layer);
    4 stands in for the interpreter."""
    if device.type != "cuda":
        return 4
    return _sm_count(_index(device))


@functools.lru_cache(maxsize=None)
def _sm_limits(index: int) -> tuple:
    p = torch.cuda.get_device_properties(index)
    return (getattr(p, "regs_per_multiprocessor", 65536), getattr(p, "shared_memory_per_multiprocessor", 233472),
            getattr(p, "max_threads_per_multi_processor", 2048))


def ctas_per_sm(n_regs: int, shared: int, num_warps: int, limits=(65536, 233472, 2048)) -> int:
    """Programs of one compiled kernel that fit on an SM at once (registers allocated per warp in
    units of 256, 1 KB of shared memory reserved per program), given the SM's (registers, shared
    bytes, threads); at least 1."""
    regs, smem, threads = limits
    per_warp = -(-n_regs * 32 // 256) * 256
    return max(1, min(regs // max(1, per_warp * num_warps), smem // (shared + 1024), threads // (32 * num_warps), 32))


def sm_limits(device: torch.device) -> tuple:
    """(registers, shared memory bytes, threads) of one SM of a CUDA device, asked once."""
    return _sm_limits(_index(device))


def tma_aligned(t) -> bool:
    """What a tensor descriptor (TMA) over t [A, B, D] needs: 16-byte aligned base and outer strides."""
    return all(x % 16 == 0 for x in (t.data_ptr(), t.stride(0) * t.element_size(), t.stride(1) * t.element_size()))


def kv_descriptors(k, v, rows: int, box: int, tma, who: str) -> tuple:
    """(k_desc, v_desc, tma): tensor descriptors over the first `rows` rows of k, v [H, L, D] with a [1, box, D]
    box where `tma` is True, or None and k is on a Hopper-or-newer GPU with both aligned (`tma_aligned`, a
    contiguous last dimension of 16 bytes or more); else (k, v, False), for pointer loads. tma=True on unaligned
    tensors is refused."""
    aligned = (all(tma_aligned(t) and t.stride(2) == 1 for t in (k, v)) and k.shape[2] * k.element_size() >= 16)
    if tma is None:
        tma = k.is_cuda and torch.cuda.get_device_capability(k.device)[0] >= 9 and aligned
    if not tma:
        return k, v, False
    if not aligned:
        raise ValueError(f"{who}: tma=True needs 16-byte aligned k / v bases, row strides and rows")
    from triton.tools.tensor_descriptor import TensorDescriptor
    shape, bx = [k.shape[0], int(rows), k.shape[2]], [1, int(box), k.shape[2]]
    return (TensorDescriptor(k, shape, [k.stride(0), k.stride(1), 1], bx),
            TensorDescriptor(v, shape, [v.stride(0), v.stride(1), 1], bx), True)
