"""A guard against host synchronisation inside a device round, on any device.

A CUDA graph cannot hold an op that makes the host wait for the device (`.item()`, indexing with a
0-dim tensor, boolean masks, `nonzero`, data-dependent shapes) or that copies pageable host memory;
inside a capture such an op invalidates the whole capture, and the error surfaces only at its end,
leaving the graph pool and the RNG half-captured for the rest of the process. `NoHostSync` finds
them eagerly, at the op, and on the CPU as well (where nothing else would notice), so the engine
checks a round under it before capturing and the tests run the round under it on the CPU.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class HostSyncError(RuntimeError):
    pass


def _sync_ops():
    names = ["_local_scalar_dense.default", "nonzero.default", "is_nonzero.default", "equal.default",
             "masked_select.default", "unique_consecutive.default", "unique_dim.default", "_unique2.default",
             "_unique.default", "allclose.default"]
    ops = set()
    for n in names:
        pkt, _, ov = n.partition(".")
        op = getattr(getattr(aten, pkt, None), ov, None)
        if op is not None:
            ops.add(op)
    return ops


_SYNC = _sync_ops()
_INDEX = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_COPY = {aten._to_copy.default, aten.copy_.default}


def _devices(x):
    return x.device.type if isinstance(x, torch.Tensor) else None


class NoHostSync(TorchDispatchMode):
    """Raise HostSyncError at the first op that would sync the host with the device or copy host memory
    to or from it (CPU tensors of 0 dims, which kernels take as scalars, excepted)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNC:
            raise HostSyncError(f"{func} reads a device value on the host (a sync a CUDA graph cannot hold)")
        if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            raise HostSyncError("repeat_interleave without output_size has a data-dependent shape")
        if func in _INDEX:
            for i in args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ():
                if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                    raise HostSyncError(f"{func} with a boolean mask has a data-dependent shape")
        if func in _COPY:
            src = args[1] if func is aten.copy_.default else args[0]
            dst = _devices(args[0]) if func is aten.copy_.default else str(kwargs.get("device") or src.device)
            s = _devices(src)
            dst = dst.split(":")[0] if dst else s
            if s != dst and (s == "cpu" and src.dim() > 0 or dst == "cpu"):
                raise HostSyncError(f"{func} copies between the host and the device ({s} -> {dst})")
        return func(*args, **kwargs)


def _debug_mode(mode):
    """torch's CUDA sync debug mode set to `mode` for a region (nothing without CUDA)."""
    import contextlib
    stack = contextlib.ExitStack()
    if torch.cuda.is_available() and torch.cuda.get_sync_debug_mode() != mode:
        stack.callback(torch.cuda.set_sync_debug_mode, torch.cuda.get_sync_debug_mode())
        torch.cuda.set_sync_debug_mode(mode)
    return stack


def guarded(on: bool = True):
    """`NoHostSync` and, on CUDA, torch's sync debug mode set to raise, when `on`."""
    import contextlib
    stack = contextlib.ExitStack()
    if on:
        stack.enter_context(NoHostSync())
        stack.enter_context(_debug_mode(2))
    return stack


def host_read():
    """A region that reads the device on the host on purpose (the CPU reference plans, never captured):
    neither the guard nor torch's sync debug mode looks inside."""
    import contextlib
    from torch.utils._python_dispatch import _disable_current_modes
    stack = contextlib.ExitStack()
    stack.enter_context(_disable_current_modes())
    stack.enter_context(_debug_mode(0))
    return stack
