"""The prompt's prefill on the device: fixed chunks of PREFILL_CHUNK rows, one graph replayed per
chunk on CUDA. The host prefill (`Runner.prefill`) runs each chunk eagerly from host lengths: 2.2 s
for a 3,106-token prompt on a warm H100, 44 s on a fresh one, where its kernels compiled anew as the
length grew (`bench/results/gpu-s32/`). A chunk here is the verify pass of a 128-row chain, which the
round's kernels already run from device lengths: 8-11x faster warm (`scripts/probe_prefill.py`).
`DeviceEngine` mixes this in (`self.runner`, `self._pf`, `self._plan`, `self._run`, `self.kernels`)."""
from __future__ import annotations

import torch

from ssv.engine.modes import decoding

# a prefill chunk's rows: the kernels' most new rows a step (the tree buckets' bound too)
PREFILL_CHUNK = 128


class DevicePrefill:
    def _prefill_body(self, taps, out: dict) -> None:
        # one chunk of the prompt as a chain of PREFILL_CHUNK rows, the first n real (the rest write
        # past the committed length, in the scratch slots: never read), committed on the device;
        # `out` is this graph's own (each taps set is a graph, each with its own output tensors)
        cache, model, io = self.runner.cache, self.runner.model, self._pf
        plan = self._plan(("prefill",), PREFILL_CHUNK)
        pos = cache.dlen.long() + io["rows"]
        plan.plan(cache.dlen, pos, io["mask"])
        out["logits"], out["taps"] = model(io["tok"], pos, plan, cache, logits_rows=io["n"] - 1, taps=taps)
        cache.commit_device(io["rows"], io["n"], kernel=self.kernels)

    @decoding
    def prefill(self, ids: list, progress: bool = False, taps=()):
        """`Runner.prefill` on the device: the prompt in chunks of PREFILL_CHUNK rows, one graph
        replayed per chunk on CUDA (the host prefill launches a step's kernels eagerly per chunk),
        the last chunk padded. Returns the last position's logits [V] and the taps per chunk."""
        r, C = self.runner, PREFILL_CHUNK
        r.check_prompt(ids)
        if r.cache.scratch < C:
            raise ValueError(f"a device prefill needs {C} scratch slots, the cache has {r.cache.scratch}")
        dev = r.device
        if self._pf is None:
            j = torch.arange(C, device=dev)
            self._pf = {"tok": torch.zeros(C, dtype=torch.long, device=dev), "rows": j,
                        "n": torch.ones(1, dtype=torch.long, device=dev), "mask": j[:, None] >= j[None, :]}
        io = self._pf
        padded = torch.zeros(-(-len(ids) // C) * C, dtype=torch.long)
        padded[:len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        padded = padded.to(dev, non_blocking=True)
        r.cache.sync_device()
        key = ("prefill", tuple(taps))
        out = io.setdefault(key, {})
        phases = [(key, lambda: self._prefill_body(taps, out))]
        from tqdm import tqdm
        tapped = []
        for c0 in tqdm(range(0, len(ids), C), desc="prefill", unit="chunk", disable=not progress, leave=False):
            m = min(C, len(ids) - c0)
            io["tok"].copy_(padded[c0:c0 + C])
            io["n"].fill_(m)
            self._run(phases)
            r.cache.advance_host(m)
            if taps:   # the graph's outputs are overwritten by the next chunk's replay
                tapped.append([t[:m].clone() for t in out["taps"]])
        return out["logits"][-1].clone(), tapped
