"""A round's phases as CUDA graphs: captured lazily after a warm-up (vLLM / SGLang style), one shared
pool, replayed; a phase whose capture fails runs eagerly from then on (it costs speed, never the
answer). `DeviceEngine` mixes this in; its `_state()` names the tensors a warm-up must leave as found."""
from __future__ import annotations

import traceback
import warnings

import torch

from ssv.engine.sync_guard import guarded


def _where(e: BaseException) -> str:
    """The innermost frame of ssv's own code in the traceback (where the offending op was called)."""
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if "/ssv/" in f.filename.replace("\\", "/")] or frames
    return f"{own[-1].filename}:{own[-1].lineno}" if own else "?"


class PhaseGraphs:
    """Graph capture and replay over `self._graphs` (phase key -> CUDAGraph), `self._eager` (keys whose
    capture failed), `self._pool`, `self._warm` (keys warmed up uncaptured), `self.graphs` (capture at all),
    `self.check_sync`, `self.timing`;
    the host class provides `_state()`."""

    def _run(self, phases) -> None:
        """Run a round's phases [(key, body)]: their graphs replayed (captured on first use), or eagerly."""
        self._ensure_captured(phases)
        graphed = self.graphs and phases[0][0] in self._graphs
        ev = []
        for key, body in phases:
            if self.timing and self.graphs:
                ev.append(torch.cuda.Event(enable_timing=True))
                ev[-1].record()
            if graphed:
                self._graphs[key].replay()
            else:
                with guarded(self.check_sync):
                    body()
        if ev:
            ev.append(torch.cuda.Event(enable_timing=True))
            ev[-1].record()
        return [(key[0], a, b) for (key, _), a, b in zip(phases, ev, ev[1:])]

    def _capture(self, phases) -> None:
        # warm up (compiles, occupancy lookups, allocator) on a copy of the round's state, restored
        # after: a warm-up commits like a real round; the capture itself runs nothing. The first
        # warm-up runs under the host-sync guard: an op a graph cannot hold is found at the op,
        # before a capture starts (inside one it would only show as an invalidated capture at its
        # end, with the graph pool left half-captured)
        restore = self._saved()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        stage = "warm-up"
        try:
            with torch.cuda.stream(side):
                for i in range(2):
                    with guarded(i == 0):
                        for _, body in phases:
                            body()
                    restore()
            torch.cuda.current_stream().wait_stream(side)
            stage = "capture"
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graphs = {}
            for key, body in phases:
                graphs[key] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graphs[key], pool=self._pool, capture_error_mode="thread_local"):
                    body()
        except Exception as e:  # noqa: BLE001 -- a capture failure must cost speed, never the answer
            if stage == "capture":
                self._release_pool()
            torch.cuda.synchronize()
            restore()
            at = _where(e)
            warnings.warn(f"CUDA graph {stage} of {phases[0][0][0]} failed ({type(e).__name__}: {e} at {at}); "
                          "running it eagerly")
            self._eager.add(phases[0][0])
            return
        restore()
        self._graphs.update(graphs)

    def _saved(self):
        """A copy of the round's state, and the function that puts it back."""
        saved = [t.clone() for t in self._state()]

        def restore():
            for t, s in zip(self._state(), saved):
                t.copy_(s)
        return restore

    def _ensure_captured(self, phases) -> None:
        """Capture the phases' graphs unless they are captured, or failed to be (graphs on)."""
        if self.graphs and phases[0][0] not in self._eager and phases[0][0] not in self._graphs:
            self._capture(phases)

    def _prepare(self, phases, force: bool = False) -> None:
        """Before a decode clock starts: capture the phases' graphs (graphs on), or run them once on a
        copy of the state and put it back (CUDA eager: the kernels compile; force: on any device, which
        the CPU tests use to check that a warm-up leaves the state as found)."""
        key = phases[0][0]
        if self.graphs:
            return self._ensure_captured(phases)
        if key in self._warm or not (force or torch.device(self.runner.device).type == "cuda"):
            return
        restore = self._saved()
        for _, body in phases:
            body()
        restore()
        self._warm.add(key)

    def _release_pool(self) -> None:
        """After a failed capture: the allocator may still route this stream's allocations to the pool
        (the capture's end never ran); end that and leave the pool to the graphs already captured."""
        end = getattr(torch._C, "_cuda_endAllocateToPool", None)
        if end is not None:
            try:
                end(torch.cuda.current_device(), self._pool)
            except Exception:  # noqa: BLE001 -- nothing was routed: nothing to end
                pass
        self._pool = None
