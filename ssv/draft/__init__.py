"""EAGLE-3 drafting: the draft head, its inference-time drafter, and its training (`ssv train-draft`).

    from ssv.draft import load_default_head, Eagle3Drafter
    head, cfg = load_default_head(target_cfg=model.cfg)
    drafter = Eagle3Drafter(head, model)
    logp = drafter.commit(taps, next_tokens)        # taps from Transformer.forward(..., taps=drafter.taps)
    tree = drafter.propose(root_token, logp, TreeSpec(depth=6, top_k=8, total_tokens=48))
"""
from __future__ import annotations

from pathlib import Path

from ssv.draft.drafter import Eagle3Drafter, join_prefill_taps
from ssv.draft.eagle3 import (
    DEFAULT_WINDOW,
    Eagle3Config,
    Eagle3Head,
    check_compatible,
    default_layer_ids,
)
from ssv.draft.io import head_size_bytes, load_eagle3, read_config, save_eagle3

__all__ = [
    "DEFAULT_WINDOW",
    "Eagle3Config",
    "Eagle3Drafter",
    "Eagle3Head",
    "check_compatible",
    "default_head_path",
    "default_layer_ids",
    "head_size_bytes",
    "join_prefill_taps",
    "load_default_head",
    "load_drafter",
    "load_eagle3",
    "read_config",
    "save_eagle3",
]


def default_head_path() -> Path:
    """The shipped head for the default target (SmolLM2-135M-Instruct): ssv/data/eagle3-smollm2/."""
    return Path(__file__).resolve().parent.parent / "data" / "eagle3-smollm2"


def load_default_head(device="cpu", dtype=None, target_cfg=None):
    """(head, cfg) of the shipped head; FileNotFoundError with instructions when it is absent."""
    import torch

    path = default_head_path()
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"no EAGLE-3 head at {path} (config.json + model.safetensors). Train one on a GPU with "
            f"`scripts/train_draft_gpu.sh` (or `ssv train-draft --run-dir runs/draft --export {path}`), "
            f"or pass the folder of a trained head explicitly.")
    return load_eagle3(path, device=device, dtype=dtype or torch.float32, target=target_cfg)


def load_drafter(spec: str, model) -> Eagle3Drafter:
    """The drafter of a target `model`: `spec` 'default' (the shipped head) or a head's folder, loaded
    on the model's device and in its dtype, checked against its config."""
    p = next(model.parameters())
    if spec == "default":
        head, _ = load_default_head(device=p.device, dtype=p.dtype, target_cfg=model.cfg)
    else:
        head, _ = load_eagle3(spec, device=p.device, dtype=p.dtype, target=model.cfg)
    from ssv.ops.linear.cpu import prepack
    prepack(head)    # the CPU's packed GEMM weights, made before the first (timed) draft
    return Eagle3Drafter(head, model)
