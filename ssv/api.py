"""The Python API: a model loaded once, then any number of generations that reuse its runners, device
engines and captured CUDA graphs (the command line builds them anew in every process).

    import ssv
    llm = ssv.LLM("default", device="cuda")
    out = llm.generate("Why is the sky blue?", max_new_tokens=64, mode="ssv")
    print(out.text, out.stats["tokens_per_second"], out.stats["mean_accepted_length"])

Modes and defaults are the command line's (`ssv generate --help`): "ar" (autoregressive), "sd-naive"
(tree speculation, each query verified on its own) and "ssv" (grouped verification; strict greedy output
equals "ar"'s, sampled output has its distribution). A prompt is text (the user's turn of the chat
template unless chat=False) or token ids.

An LLM keeps one CUDA graph set per kind of step it has run (AR; a round per tree shape and verify
options; greedy, sampled, sampled with top-p): temperature and top_p are device scalars the graphs read,
so a new setting replays the graphs already captured. Not thread-safe: one generation at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ssv.cli import MODES, check_seed, encode_prompt, fallback_for, load_model, spec_options, unread_options


@dataclass
class Generation:
    text: str              # the new tokens decoded (end-of-text tokens left out)
    token_ids: list        # the new tokens, end-of-text included where it stopped there
    stats: dict = field(default_factory=dict)   # tokens_per_second, mean_accepted_length, stop, rounds, ...


class LLM:
    """A target model (and, on first speculative use, its EAGLE-3 drafter) with one runner and one device
    engine per attention, kept across `generate` calls.

    model: "default" (SmolLM2-135M-Instruct) or a GGUF file / Hugging Face or FLA folder; device "cpu" or
    "cuda"; dtype None (fp32 on the CPU, bf16 on CUDA), "float32", "bfloat16" or "float16"; draft: "default"
    (the shipped head) or a head's folder; eager: no CUDA graphs."""

    def __init__(self, model: str = "default", device: str = "cpu", dtype: Optional[str] = None,
                 draft: str = "default", eager: bool = False):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        m, tok = load_model(model, device, dtype, progress=False)
        self._setup(m, tok, device, draft, eager)

    @classmethod
    def from_model(cls, model, tokenizer, draft: str = "default", eager: bool = False) -> "LLM":
        """An LLM over an already loaded `ssv.model.Transformer` and its tokenizer (on their device)."""
        self = cls.__new__(cls)
        self._setup(model, tokenizer, next(model.parameters()).device.type, draft, eager)
        return self

    def _setup(self, model, tok, device: str, draft: str, eager: bool) -> None:
        if tok is None:
            raise ValueError("this checkpoint has no tokenizer; ssv needs tokenizer.json beside it")
        if draft != "default":   # a bad head folder refused now, not at the first speculative call
            from ssv.draft.io import read_config
            read_config(draft)
        self.model, self.tokenizer, self.device = model, tok, device
        self._draft, self._graphs = draft, device == "cuda" and not eager
        self._drafter = None
        self._runners, self._engines = {}, {}

    def _engine(self, attention: str, speculative: bool):
        # one engine a runner, as `ssv bench e2e` keeps them: AR steps and rounds alike; its graphs are
        # captured on first use and replayed after. An AR-only engine gives way to one with the drafter
        from ssv.engine.device_round import DeviceEngine
        from ssv.engine.runner import Runner
        if attention not in self._runners:
            self._runners[attention] = Runner(self.model, attention=attention)
        if speculative and self._drafter is None:
            from ssv.draft import load_drafter
            self._drafter = load_drafter(self._draft, self.model)
        eng = self._engines.get(attention)
        if eng is None or (speculative and eng.drafter is None):
            eng = self._engines[attention] = DeviceEngine(self._runners[attention], self._drafter, graphs=self._graphs)
        return self._runners[attention], eng

    def generate(self, prompt: Optional[str] = None, *, prompt_ids: Optional[Sequence[int]] = None,
                 max_new_tokens: int = 64, mode: str = "ar", attention: str = "nsa", temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, chat: bool = True, precision: str = "strict",
                 group_size: int = 4, tree: Optional[tuple] = None, lookup: Optional[int] = None,
                 traversal: str = "pos", refresh_every: int = 1, fallback: bool = True) -> Generation:
        """Generate from `prompt` (text) or `prompt_ids`. tree: (depth, top-k, nodes) with None entries
        for the defaults; lookup: a chain of up to K tokens drafted from the text itself (None: the
        mode's default); fallback: mode "ssv" takes AR steps while speculation does not pay."""
        from ssv.engine.generate import generate_ar
        from ssv.engine.spec import generate_spec
        from ssv.spec.accept import SamplingParams

        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if attention not in ("nsa", "dense"):
            raise ValueError(f"attention must be 'nsa' or 'dense', got {attention!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        seed = int(seed)
        check_seed(seed, "seed")
        tree = (None, None, None) if tree is None else tuple(tree)
        if len(tree) != 3:
            raise ValueError(f"tree must be (depth, top_k, nodes), None entries for the defaults, got {tree!r}")
        params = SamplingParams(temperature=temperature, top_p=top_p)
        ids = self._ids(prompt, prompt_ids, chat)
        given = unread_options(mode, dict(tree_depth=tree[0], tree_topk=tree[1], tree_tokens=tree[2], lookup=lookup,
                                          traversal=traversal, fallback=fallback, precision=precision,
                                          group_size=group_size, refresh_every=refresh_every))
        if given:
            raise ValueError(f"{given[0]} does not apply to mode {mode!r}")
        if mode == "ar":
            runner, engine = self._engine(attention, False)
            res = generate_ar(runner, ids, params, max_new_tokens, seed=seed, stop_ids=self.tokenizer.eos_ids,
                              engine=engine)
        else:
            opts = spec_options(mode, self.device, self.model.cfg.n_layers, tree, lookup, group_size, precision,
                                refresh_every, traversal)
            runner, engine = self._engine(attention, True)
            fb = fallback_for(self.device, opts) if mode == "ssv" and fallback else None
            res = generate_spec(runner, self._drafter, ids, params, max_new_tokens, opts, seed=seed,
                                stop_ids=self.tokenizer.eos_ids, engine=engine, fallback=fb)
        gen = [t for t in res.token_ids if t not in self.tokenizer.eos_ids]
        return Generation(self.tokenizer.decode(gen), list(res.token_ids), res.stats)

    def _ids(self, prompt, prompt_ids, chat: bool) -> list:
        if (prompt is None) == (prompt_ids is None):
            raise ValueError("give either prompt (text) or prompt_ids, not both or neither")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise ValueError(f"prompt must be text (token ids go in prompt_ids), got {type(prompt).__name__}")
            if not prompt.strip():
                raise ValueError("empty prompt")
            return encode_prompt(self.tokenizer, prompt, chat)
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("empty prompt: give at least one token")
        return ids
