"""Training / evaluation prompts from text every Python installation carries (no download).

Sources: CPython's `pydoc_data.topics` (the language reference's help topics), the module
docstrings of the standard library, and the stdlib source itself (functions and classes), read
with `ast` (nothing is imported). Each text becomes one chat prompt ("Summarize / explain /
continue / review ...") whose answer the TARGET writes (self-distillation, see train.py).

Split: by SOURCE (a topic, or a stdlib file), with a hash of its name -- every chunk and template of
one file falls on the same side, so evaluation prompts are never trained on, and the split is the
same on every machine. The stdlib differs between Python versions, so a training run writes the
eval prompts it held out to `eval_prompts.jsonl` (run dir and exported head); evaluation should read
that file (`read_prompts`) when it exists.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import sysconfig
from pathlib import Path
from typing import List, Optional, Sequence

EVAL_PERCENT = 5
SOURCES = ("topics", "docs", "code")
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "_bundled",
              "lib-dynload", "__phello__", "turtledemo"}

_TOPIC_TEMPLATES = (
    "Summarize the following section of the Python documentation:\n\n{text}",
    "Explain the following part of the Python documentation to a beginner, with a short example:\n\n{text}",
    "What are the key points of the following text?\n\n{text}",
    "Continue the following text:\n\n{text}",
)
_DOC_TEMPLATES = (
    "Explain what the Python module `{name}` is for, based on its documentation:\n\n{text}",
    "Summarize the following module documentation in a few sentences:\n\n{text}",
    "Write a short tutorial that uses the Python module `{name}`. Its documentation says:\n\n{text}",
)
_CODE_TEMPLATES = (
    "Explain what the following Python code does:\n\n```python\n{text}\n```",
    "Review the following Python code and suggest improvements:\n\n```python\n{text}\n```",
    "Write a docstring and a usage example for the following code:\n\n```python\n{text}\n```",
    "Continue the following Python code:\n\n```python\n{text}\n```",
)


def _h(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode("utf-8")).digest()[:8], "big")


def is_eval(split_key: str, percent: int = EVAL_PERCENT) -> bool:
    return _h("split:" + split_key) % 100 < percent


def _chunks(text: str, max_chars: int) -> List[str]:
    """Paragraph-aligned pieces of at most ~max_chars characters (longer paragraphs are cut)."""
    out, cur = [], ""
    for para in text.split("\n\n"):
        while len(para) > max_chars:
            out.append(para[:max_chars])
            para = para[max_chars:]
        if cur and len(cur) + len(para) + 2 > max_chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    if cur.strip():
        out.append(cur)
    return [c.strip() for c in out if len(c.strip()) >= 80]


def _prompt(pid: str, split_key: str, kind: str, templates: Sequence[str], n: int = 1, **fields) -> List[dict]:
    """n prompts (distinct templates, chosen by hash) for one text."""
    first = _h("tpl:" + pid) % len(templates)
    return [{"id": f"{pid}#{j}", "split_key": split_key, "kind": kind,
             "text": templates[(first + j) % len(templates)].format(**fields)} for j in range(n)]


def _topic_prompts(max_chars: int) -> List[dict]:
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        for i, chunk in enumerate(_chunks(topics[key], max_chars)):
            out += _prompt(f"topic:{key}:{i}", f"topic:{key}", "topics", _TOPIC_TEMPLATES, 2, text=chunk)
    return out


def _stdlib_files() -> List[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(("config-", ".")))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def _file_prompts(max_chars: int, docs: bool, code: bool) -> List[dict]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in _stdlib_files():
        rel = path.relative_to(root).as_posix()
        try:
            src = path.read_text(encoding="utf-8", errors="replace")
            tree = ast.parse(src)
        except (SyntaxError, ValueError, OSError):
            continue
        name = rel[:-3].replace("/", ".").removesuffix(".__init__")
        if docs:
            doc = ast.get_docstring(tree)
            for i, chunk in enumerate(_chunks(doc or "", max_chars)):
                out += _prompt(f"doc:{rel}:{i}", f"file:{rel}", "docs", _DOC_TEMPLATES, 2, text=chunk, name=name)
        if code:
            lines = src.splitlines()
            defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            nodes = [n for n in tree.body if isinstance(n, defs)]
            nodes += [m for n in nodes if isinstance(n, ast.ClassDef) for m in n.body if isinstance(m, defs)]
            for node in nodes:
                seg = "\n".join(lines[node.lineno - 1 - len(node.decorator_list): node.end_lineno])
                if len(seg) > max_chars:  # big classes: keep the head of the class
                    seg = seg[:max_chars].rsplit("\n", 1)[0]
                if len(seg) >= 120:
                    out += _prompt(f"code:{rel}:{node.name}:{node.lineno}", f"file:{rel}", "code",
                                   _CODE_TEMPLATES, text=seg)
    return out


@functools.lru_cache(maxsize=8)
def all_prompts(sources: tuple = SOURCES, max_chars: int = 2500) -> tuple:
    """Every prompt, in a deterministic shuffled order (by hash of its id)."""
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown prompt sources {sorted(unknown)}; choose from {SOURCES}")
    out = _topic_prompts(max_chars) if "topics" in sources else []
    if "docs" in sources or "code" in sources:
        out += _file_prompts(max_chars, "docs" in sources, "code" in sources)
    return tuple(sorted(out, key=lambda p: (_h("order:" + p["id"]), p["id"])))


def train_prompts(limit: Optional[int] = None, sources: Sequence[str] = SOURCES, max_chars: int = 2500) -> List[dict]:
    ps = [p for p in all_prompts(tuple(sources), max_chars) if not is_eval(p["split_key"])]
    return ps[:limit] if limit is not None else ps


def eval_prompts(limit: Optional[int] = None, sources: Sequence[str] = SOURCES, max_chars: int = 2500,
                 path=None) -> List[dict]:
    """Held-out prompts; `path` (an eval_prompts.jsonl written by a training run) takes precedence."""
    if path is not None:
        ps = read_prompts(path)
    else:
        ps = [p for p in all_prompts(tuple(sources), max_chars) if is_eval(p["split_key"])]
    return ps[:limit] if limit is not None else ps


def write_prompts(path, prompts: Sequence[dict]) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_prompts(path) -> List[dict]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt list not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# Self-instruct: the target itself writes general chat questions from these seeds (offline, no data
# set), so the head also sees the target answering everyday prompts, not only stdlib ones.
SELF_TOPICS = (
    "the weather", "cooking pasta", "baking bread", "healthy breakfast", "sleep", "running", "yoga", "chess",
    "football", "the Olympic games", "photosynthesis", "black holes", "the Moon", "Mars", "volcanoes",
    "earthquakes", "climate change", "recycling", "electric cars", "bicycles", "trains", "airplanes",
    "the ocean", "coral reefs", "dinosaurs", "evolution", "DNA", "vaccines", "the human heart", "the brain",
    "memory", "learning a language", "grammar", "poetry", "Shakespeare", "novels", "writing an essay",
    "public speaking", "job interviews", "saving money", "inflation", "taxes", "startups", "marketing",
    "negotiation", "time management", "habits", "stress", "friendship", "parenting", "pets", "dogs", "cats",
    "gardening", "houseplants", "birds", "bees", "the Roman Empire", "ancient Egypt", "the printing press",
    "the Industrial Revolution", "World War II", "democracy", "philosophy", "ethics", "logic puzzles",
    "prime numbers", "probability", "statistics", "geometry", "calculus", "algebra", "fractions",
    "music theory", "the guitar", "the piano", "painting", "photography", "movies", "video games",
    "the internet", "email etiquette", "passwords", "computer viruses", "smartphones", "batteries",
    "solar power", "wind turbines", "nuclear energy", "water", "coffee", "tea", "chocolate", "vegetables",
    "travel in Europe", "camping", "hiking", "maps", "time zones", "calendars", "holidays", "birthdays",
    "recipes for soup", "knitting", "woodworking", "cars", "traffic", "cities", "architecture", "bridges",
    "sorting algorithms", "databases", "web servers", "JavaScript", "Linux", "spreadsheets", "robots",
    "artificial intelligence", "the history of computers", "space travel", "rainbows", "why the sky is blue",
)
SELF_TEMPLATES = (  # the forms the default model follows best in a short trial (it tends to quote the question)
    "Write a question about {topic} that a student might ask.",
    "Write a question about {topic} that a curious adult might ask.",
    "Write a request about {topic} that someone might send to a helpful assistant.",
)


def self_seeds(n: int) -> List[dict]:
    """n question-writing seeds (topic x template x sample), in a fixed order; split by topic."""
    out = []
    k = 0
    while len(out) < n:
        for topic in SELF_TOPICS:
            tpl = SELF_TEMPLATES[(_h("selftpl:" + topic) + k) % len(SELF_TEMPLATES)]
            out.append({"id": f"self:{topic}:{k}", "split_key": f"self:{topic}", "kind": "self",
                        "text": tpl.format(topic=topic)})
            if len(out) == n:
                break
        k += 1
    return out


def clean_question(text: str) -> Optional[str]:
    """The generated question as a prompt, or None when it is unusable (too short or too long).
    'A student might ask: "What is X?' -> 'What is X?': the quoted part, but only after a lead-in
    ("... ask:", "... question:") or when the whole text is quoted; other quotes belong to the question."""
    text = text.strip().split("\n\n")[0].strip()
    lead = re.search(r'\b(?:ask|asks|asked|asking|request|question|query)\b[^"]{0,12}"([^"]+)', text, re.IGNORECASE)
    if lead:
        text = lead.group(1)
    elif text.startswith('"') and text.count('"') <= 2:
        text = text.strip('"')
    text = text.strip()
    if text.lower().startswith(("question:", "request:", "task:")):
        text = text.split(":", 1)[1].strip()
    if len(text) < 12 or len(text) > 400:
        return None
    return text


def split_files(split: str) -> List[tuple]:
    """(path, stdlib-relative name) of the stdlib files on one side of the split, in stdlib order."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [(path, path.relative_to(root).as_posix()) for path in _stdlib_files()]
    return [(p, rel) for p, rel in files if is_eval(f"file:{rel}") == (split == "eval")]


def document_text(path: Path, rel: str) -> str:
    """A source file as a plain document: the form trained on (--raw-tokens) and evaluated on (bench spec)."""
    return f"# file: {rel}\n" + path.read_text(encoding="utf-8", errors="replace")


def raw_documents(tokenizer, split: str, seq_len: int, max_tokens: int, min_len: int = 128) -> List[List[int]]:
    """Plain stdlib source files of one side of the split, as `seq_len`-token pieces (at most
    `max_tokens` in all), in the format `ssv bench spec` continues: "# file: <path>" + the source.

    No chat template and no generation: the target's own soft distribution over every token is the
    label (loss on all tokens), so the head also learns to continue long documents, which chat
    answers alone do not teach. Files are taken in a hash order so a token cap samples the stdlib.
    """
    files = sorted(split_files(split), key=lambda f: (_h("raw:" + f[1]), f[1]))
    out, total, min_len = [], 0, min(min_len, seq_len)
    for path, rel in files:
        try:
            text = document_text(path, rel)
        except OSError:
            continue
        ids = tokenizer.encode(text)
        for i in range(0, len(ids), seq_len):
            piece = ids[i:i + seq_len]
            if len(piece) < min_len:
                continue
            piece = piece[: max_tokens - total]
            if len(piece) < min_len:
                return out
            out.append(piece)
            total += len(piece)
            if total >= max_tokens:
                return out
    return out


def chat_ids(tokenizer, prompt: dict, max_prompt_tokens: int) -> List[int]:
    """The chat-formatted prompt ids (the user text is cut so the prompt fits max_prompt_tokens)."""
    text = prompt["text"]
    for _ in range(8):
        ids = tokenizer.encode_chat([{"role": "user", "content": text}])
        if len(ids) <= max_prompt_tokens:
            return ids
        text = text[: int(len(text) * max_prompt_tokens / len(ids) * 0.95)]
    return ids[:max_prompt_tokens]
