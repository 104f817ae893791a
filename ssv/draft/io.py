"""Save / load EAGLE-3 heads as `config.json` + `model.safetensors` (the SpecForge / EAGLE layout)."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional

import torch

from ssv.draft.eagle3 import Eagle3Config, Eagle3Head
from ssv.draft.vocab import check_mapping

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# tensors some exporters add that the head does not own: the target's embedding (shared here)
_IGNORED = ("embed_tokens.weight",)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def head_size_bytes(cfg: Eagle3Config, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the tensors `save_eagle3` writes (headers excluded)."""
    with torch.device("meta"):
        m = Eagle3Head(cfg)
    item = torch.tensor([], dtype=dtype).element_size()
    n = sum(p.numel() for p in m.parameters()) * item
    return n + cfg.draft_vocab_size * 8 + cfg.vocab_size


def save_eagle3(folder, head: Eagle3Head, cfg: Optional[Eagle3Config] = None, dtype: torch.dtype = torch.bfloat16,
                metadata: Optional[dict] = None) -> Path:
    """Write `folder/config.json` and `folder/model.safetensors` (weights in `dtype`); returns the folder."""
    from safetensors.torch import save_file

    cfg = cfg or head.cfg
    if cfg != head.cfg:
        raise ValueError("save_eagle3: cfg does not describe this head")
    check_mapping(head.d2t.cpu(), head.t2d.cpu(), cfg.vocab_size)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in head.state_dict().items():
        t = t.detach().cpu()
        tensors[name] = (t.to(dtype) if t.is_floating_point() else t).contiguous()
    dtype_name = {v: k for k, v in _DTYPES.items()}[dtype]
    # write-then-rename so an interrupted save never leaves a half-written head
    for name, write in ((WEIGHTS_NAME, lambda p: save_file(tensors, p, metadata={"format": "pt"})),
                        (CONFIG_NAME, lambda p: Path(p).write_text(
                            json.dumps(dict(cfg.to_json_dict(dtype_name), **(metadata or {})), indent=2) + "\n"))):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, folder / name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return folder


def read_config(folder) -> Eagle3Config:
    folder = Path(folder)
    if not folder.exists():
        raise FileNotFoundError(f"EAGLE-3 head folder not found: {folder}")
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; an EAGLE-3 head is a folder with {CONFIG_NAME} + {WEIGHTS_NAME}")
    path = folder / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG_NAME}; an EAGLE-3 head folder holds "
                                f"{CONFIG_NAME} + {WEIGHTS_NAME}")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    return Eagle3Config.from_json_dict(d, str(path))


def load_eagle3(folder, device="cpu", dtype: torch.dtype = torch.float32, target=None):
    """(head, cfg) from a head folder; `target` (a ModelConfig) is checked with check_compatible."""
    from ssv.loaders import read_safetensors

    cfg = read_config(folder)
    if target is not None:
        from ssv.draft.eagle3 import check_compatible

        check_compatible(cfg, target)
    path = Path(folder) / WEIGHTS_NAME
    if not path.is_file():
        others = sorted(p.name for p in Path(folder).glob("*.bin")) + sorted(p.name for p in Path(folder).glob("*.pt"))
        hint = f" (found {', '.join(others)}: only safetensors heads are supported)" if others else ""
        raise FileNotFoundError(f"{folder} has no {WEIGHTS_NAME}{hint}")
    raw = read_safetensors(path)
    sd = {}
    for name, t in raw.items():
        key = name[len("model."):] if name.startswith("model.") else name
        if key in _IGNORED:
            continue
        sd[key] = t
    head = Eagle3Head(cfg)
    expected = head.state_dict()
    if "d2t" not in sd and cfg.draft_vocab_size == cfg.vocab_size:
        sd["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)  # identity
    if "t2d" not in sd and "d2t" in sd:
        tgt = torch.arange(cfg.draft_vocab_size) + sd["d2t"].long()
        sd["t2d"] = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        sd["t2d"][tgt.clamp(0, cfg.vocab_size - 1)] = True
    missing = sorted(set(expected) - set(sd))
    if missing:
        raise ValueError(f"{path}: missing tensor(s) {', '.join(missing)}")
    extra = sorted(set(sd) - set(expected))
    if extra:
        raise ValueError(f"{path}: unexpected tensor(s) {', '.join(extra)} (not an EAGLE-3 Llama head?)")
    for k, t in sd.items():
        if tuple(t.shape) != tuple(expected[k].shape):
            raise ValueError(f"{path}: tensor {k} has shape {tuple(t.shape)}, config.json implies "
                             f"{tuple(expected[k].shape)}")
    sd["d2t"], sd["t2d"] = sd["d2t"].long(), sd["t2d"].bool()
    check_mapping(sd["d2t"], sd["t2d"], cfg.vocab_size, str(path))
    head.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}, strict=True)
    return head.to(device=device, dtype=dtype).eval(), cfg
