"""A thin wrapper around a Hugging Face `tokenizers.Tokenizer` plus what generation needs from it.

`Tokenizer` does no tokenization itself: encoding and decoding are the backend's. It adds the BOS/EOS
ids, the default "add BOS" behaviour and the chat template (rendered with jinja2 exactly as
transformers renders chat templates).

Sources:
  * `Tokenizer.from_gguf(path)`: built with transformers' own GGUF tokenizer conversion
    (`transformers.integrations.gguf.get_gguf_tokenizer` / `convert_gguf_tokenizer`, the code behind
    `AutoTokenizer.from_pretrained(folder, gguf_file=...)`), offline.
  * `Tokenizer.from_hf_folder(folder)`: `tokenizer.json` (+ `tokenizer_config.json`,
    `chat_template.jinja` / `chat_template.json`, `generation_config.json`), or None.
  * `Tokenizer.load(folder)` / `save(folder)`: `tokenizer.json` + `tokenizer_meta.json`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence

import tokenizers

META_FILE = "tokenizer_meta.json"
TOKENIZER_FILE = "tokenizer.json"
META_VERSION = 1


def _token_content(tok) -> Optional[str]:
    """tokenizer_config.json spells special tokens as a string or as an AddedToken dict."""
    if tok is None:
        return None
    if isinstance(tok, dict):
        return tok.get("content")
    return str(tok)


def _unique(ids: Iterable[Optional[int]]) -> tuple:
    out = []
    for i in ids:
        if i is not None and int(i) not in out:
            out.append(int(i))
    return tuple(out)


def _as_id_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


class Tokenizer:
    """Encode/decode with a `tokenizers.Tokenizer`; BOS/EOS ids; chat template."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_id: Optional[int] = None,
        eos_ids: Sequence[int] = (),
        chat_template: Optional[str] = None,
        add_bos: bool = False,
    ):
        if not isinstance(backend, tokenizers.Tokenizer):
            raise TypeError(f"backend must be a tokenizers.Tokenizer, got {type(backend).__name__}")
        self._tok = backend
        self.bos_id = None if bos_id is None else int(bos_id)
        self.eos_ids = _unique(eos_ids)
        self.chat_template = chat_template
        self.add_bos = bool(add_bos)
        n = self.vocab_size
        for name, ids in (("bos_id", [self.bos_id]), ("eos_ids", list(self.eos_ids))):
            for i in ids:
                if i is not None and not 0 <= i < n:
                    raise ValueError(f"Tokenizer.{name} contains {i}, outside the vocabulary (size {n})")

    # ------------------------------------------------------------------ basics
    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token(self) -> Optional[str]:
        return None if self.bos_id is None else self._tok.id_to_token(self.bos_id)

    @property
    def eos_token(self) -> Optional[str]:
        return self._tok.id_to_token(self.eos_ids[0]) if self.eos_ids else None

    @property
    def eos_id(self) -> Optional[int]:
        return self.eos_ids[0] if self.eos_ids else None

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> Optional[str]:
        return self._tok.id_to_token(int(i))

    def encode(self, text: str, add_bos: Optional[bool] = None) -> list:
        """Token ids of `text`. Special tokens written in the text (e.g. `<|im_start|>`) are kept whole.

        add_bos: prepend `bos_id`. None uses the tokenizer's default (`self.add_bos`, from the GGUF's
        `tokenizer.ggml.add_bos_token` / the HF tokenizer config or post-processor), except that no
        BOS is added when the text already starts with the BOS token. True always prepends one.
        The backend's own post-processor is never applied.
        """
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            # default: the tokenizer's habit, but never a second BOS when the text (e.g. a rendered
            # chat template) already starts with one
            add_bos = self.add_bos and not (ids and ids[0] == self.bos_id)
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos=True but this tokenizer has no BOS token")
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat
    def apply_chat_template(self, messages: list, add_generation_prompt: bool = True, **kwargs) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) with the model's chat template.

        Rendered with transformers' own jinja2 machinery when available (same sandbox, filters and
        globals as `PreTrainedTokenizer.apply_chat_template`), else with an equivalent jinja2
        environment. `bos_token`/`eos_token` are passed to the template as transformers does.
        """
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        template_kwargs = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        template_kwargs.update(kwargs)
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
        except Exception:  # pragma: no cover - transformers missing or changed
            return _render_fallback(self.chat_template, messages, add_generation_prompt, template_kwargs)
        rendered, _ = render_jinja_template(
            conversations=[messages],
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )
        return rendered[0]

    def encode_chat(self, messages: list, add_generation_prompt: bool = True) -> list:
        """`encode(apply_chat_template(...))` without an extra BOS (templates write their own)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_bos=False)

    # ------------------------------------------------------------------ persistence
    def meta(self) -> dict:
        return {
            "version": META_VERSION,
            "bos_id": self.bos_id,
            "eos_ids": list(self.eos_ids),
            "add_bos": self.add_bos,
            "chat_template": self.chat_template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }

    def save(self, folder) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / TOKENIZER_FILE))
        with open(folder / META_FILE, "w", encoding="utf-8") as f:
            json.dump(self.meta(), f, ensure_ascii=False, indent=1)

    @classmethod
    def load(cls, folder) -> "Tokenizer":
        folder = Path(folder)
        tok_file, meta_file = folder / TOKENIZER_FILE, folder / META_FILE
        for p in (tok_file, meta_file):
            if not p.is_file():
                raise FileNotFoundError(f"{p} not found")
        with open(meta_file, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != META_VERSION:
            raise ValueError(f"{meta_file}: unsupported version {meta.get('version')!r}")
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
        return cls(backend, bos_id=meta.get("bos_id"), eos_ids=meta.get("eos_ids") or (),
                   chat_template=meta.get("chat_template"), add_bos=bool(meta.get("add_bos", False)))

    # ------------------------------------------------------------------ builders
    @classmethod
    def from_gguf(cls, path) -> "Tokenizer":
        """Build from a GGUF file's `tokenizer.*` metadata with transformers' GGUF converter (offline)."""
        path = os.fspath(path)
        try:  # transformers 5.x
            from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
        except ImportError:  # older transformers: the same conversion, through AutoTokenizer
            return cls._from_gguf_auto(path)
        architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(path)
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
        return cls(
            backend,
            bos_id=tokenizer_dict.get("bos_token_id"),
            eos_ids=_as_id_list(tokenizer_dict.get("eos_token_id")),
            chat_template=tokenizer_config.get("chat_template"),
            add_bos=bool(tokenizer_config.get("add_bos_token", False)),
        )

    @classmethod
    def _from_gguf_auto(cls, path: str) -> "Tokenizer":
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                           gguf_file=os.path.basename(path), local_files_only=True)
        return cls(
            hf.backend_tokenizer,
            bos_id=hf.bos_token_id,
            eos_ids=_as_id_list(hf.eos_token_id),
            chat_template=getattr(hf, "chat_template", None),
            add_bos=bool(getattr(hf, "add_bos_token", False)),
        )

    @classmethod
    def from_hf_folder(cls, folder, *, bos_id: Optional[int] = None,
                       eos_ids: Sequence[int] = ()) -> Optional["Tokenizer"]:
        """From a Hugging Face folder's `tokenizer.json`; None when the folder has none.

        bos_id/eos_ids: the model config's ids; they take precedence over the tokenizer config's
        tokens (eos ids are merged: config's first, then generation_config.json's, then the
        tokenizer config's eos token).
        """
        folder = Path(folder)
        tok_file = folder / TOKENIZER_FILE
        if not tok_file.is_file():
            return None
        backend = tokenizers.Tokenizer.from_file(str(tok_file))
        tcfg = _read_json(folder / "tokenizer_config.json") or {}
        gcfg = _read_json(folder / "generation_config.json") or {}

        chat_template = None
        if (folder / "chat_template.jinja").is_file():
            chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        elif (folder / "chat_template.json").is_file():
            chat_template = (_read_json(folder / "chat_template.json") or {}).get("chat_template")
        else:
            chat_template = tcfg.get("chat_template")
        if isinstance(chat_template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in chat_template if isinstance(t, dict)}
            chat_template = named.get("default") or next(iter(named.values()), None)

        def tid(key):
            tok = _token_content(tcfg.get(key))
            return None if tok is None else backend.token_to_id(tok)

        if bos_id is None:
            bos_id = _first(_as_id_list(gcfg.get("bos_token_id")))
        if bos_id is None:
            bos_id = tid("bos_token")
        eos = list(eos_ids) + _as_id_list(gcfg.get("eos_token_id")) + [tid("eos_token")]

        if "add_bos_token" in tcfg:
            add_bos = bool(tcfg["add_bos_token"])
        else:  # does the backend's post-processor prepend BOS?
            with_special = backend.encode("a", add_special_tokens=True).ids
            plain = backend.encode("a", add_special_tokens=False).ids
            add_bos = bos_id is not None and len(with_special) > len(plain) and with_special[0] == bos_id
        return cls(backend, bos_id=bos_id, eos_ids=eos, chat_template=chat_template, add_bos=add_bos)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_ids={self.eos_ids}, "
                f"add_bos={self.add_bos}, chat_template={'yes' if self.chat_template else 'no'})")


def _first(xs):
    return xs[0] if xs else None


def _read_json(path: Path) -> Optional[dict]:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _render_fallback(template: str, messages, add_generation_prompt: bool, kwargs: dict) -> str:
    """jinja2 rendering with the environment transformers uses for chat templates."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        from datetime import datetime
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            **kwargs)
