"""A general text corpus from what this machine carries, for the general-purpose head (no download).

Families (one document per file):
  man   English manual pages (sections 1-8), rendered to plain text as `man` shows them;
  doc   plain-text package documentation under /usr/share/doc (README, NEWS, *.txt, *.md, *.rst);
  c     C headers under /usr/include;
  sh    shell scripts (/usr/bin, /usr/sbin, /usr/lib, /etc).
Never read, by rule: Perl's documentation and modules (any path or page naming perl, man sections
*pm / *perl / 1p), licence texts (/usr/share/common-licenses, copyright / COPYING / LICENSE files, and
every paragraph that mentions a licence, a copyright or a warranty), the GNU info manuals
(/usr/share/info, *.info). An evaluation outside this project uses them.

Split by file, with data.is_eval's hash; every git manual page and git's documentation are held out by
rule, since `ssv bench e2e` and `ssv bench spec` evaluate on git's pages (scripts/make_e2e_prompts.py).
The corpus is built once (`python -m ssv.draft.corpus --out ...`, a few minutes) and carried to the
training machine as xz-compressed JSON lines: {"id", "split_key", "family", "text"}.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

from ssv.draft.data import _chunks, _h, _prompt, is_eval

FAMILIES = ("man", "doc", "c", "sh")
# characters per family at most (the machine has far more C headers than the head needs)
DEFAULT_CAPS = {"man": 36_000_000, "doc": 8_000_000, "c": 8_000_000, "sh": 2_000_000}
MAN_ROOT, DOC_ROOT, INCLUDE_ROOT = Path("/usr/share/man"), Path("/usr/share/doc"), Path("/usr/include")
SCRIPT_ROOTS = (Path("/usr/bin"), Path("/usr/sbin"), Path("/usr/lib"), Path("/etc"))
HELD_OUT_PREFIXES = ("git",)          # git's pages and docs: the benchmarks' prose and chat texts
MAX_PER_PREFIX = 200                  # one tool's thousand near-identical pages (gcloud) would dominate
_LICENCE = re.compile(r"licen[cs]|copyright|warrant|\(c\)\s*\d{4}|spdx", re.IGNORECASE)
_BANNED_NAME = re.compile(r"perl|copying|copyright|licen[cs]e|\.info(\.gz)?$|\.pm$|\.pod$", re.IGNORECASE)
_DOC_SUFFIXES = (".txt", ".md", ".rst")
_DOC_NAMES = ("readme", "news", "faq", "howto", "todo", "usage", "manual", "notes")


def banned(path: Path) -> bool:
    """Files the corpus never reads (see the module docstring)."""
    s = str(path)
    return bool(_BANNED_NAME.search(s)) or "/common-licenses" in s or "/usr/share/info" in s


def strip_licences(text: str) -> str:
    """The text without any paragraph that mentions a licence, copyright or warranty."""
    return "\n\n".join(p for p in re.split(r"\n\s*\n", text) if not _LICENCE.search(p)).strip()


def _held_out(name: str) -> bool:
    return name.lower().startswith(HELD_OUT_PREFIXES)


def man_pages() -> List[Path]:
    out = []
    for sec in range(1, 9):
        d = MAN_ROOT / f"man{sec}"
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            section = f.name.removesuffix(".gz").rsplit(".", 1)[-1]
            if f.is_file() and not banned(f) and not section.endswith(("pm", "perl", "p")):
                out.append(f)
    return _cap_prefix(out, lambda f: re.split(r"[-_.]", f.name, maxsplit=1)[0])


def _cap_prefix(files: List[Path], prefix) -> List[Path]:
    """At most MAX_PER_PREFIX files per name prefix, chosen by hash (held-out prefixes kept whole)."""
    groups: dict = {}
    for f in files:
        groups.setdefault(prefix(f), []).append(f)
    out = []
    for p, fs in groups.items():
        out += fs if _held_out(p) else sorted(fs, key=lambda f: _h("cap:" + f.name))[:MAX_PER_PREFIX]
    return sorted(out)


def render_man(path: Path) -> str:
    env = dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="0")
    try:
        raw = subprocess.run(["man", "-l", "-P", "cat", str(path)], capture_output=True, text=True, env=env,
                             timeout=60).stdout
        return subprocess.run(["col", "-bx"], input=raw, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _read(path: Path, limit: int = 400_000) -> Optional[str]:
    try:
        if path.suffix == ".gz":
            import gzip
            with gzip.open(path, "rt", encoding="utf-8", errors="strict") as f:
                return f.read(limit)
        with open(path, encoding="utf-8", errors="strict") as f:
            return f.read(limit)
    except (OSError, UnicodeDecodeError, EOFError, ValueError):
        return None  # binary or not UTF-8


def doc_files() -> List[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(DOC_ROOT):
        dirnames[:] = sorted(d for d in dirnames if not banned(Path(dirpath) / d))
        for name in sorted(filenames):
            f = Path(dirpath) / name
            base = name.lower().removesuffix(".gz")
            if banned(f) or "changelog" in base:
                continue
            if base.endswith(_DOC_SUFFIXES) or base.split(".")[0] in _DOC_NAMES:
                out.append(f)
    return out


def header_files() -> List[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(INCLUDE_ROOT):
        dirnames[:] = sorted(d for d in dirnames if not banned(Path(dirpath) / d))
        out += [Path(dirpath) / n for n in sorted(filenames) if n.endswith(".h") and not banned(Path(dirpath) / n)]
    return out


def script_files() -> List[Path]:
    out = []
    for root in SCRIPT_ROOTS:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not banned(Path(dirpath) / d) and "python" not in d)
            for n in sorted(filenames):
                f = Path(dirpath) / n
                if banned(f) or f.is_symlink() or not f.is_file():
                    continue
                try:
                    with open(f, "rb") as fh:
                        head = fh.read(64)
                except OSError:
                    continue
                if re.match(rb"#!\s*/(usr/)?bin/(env\s+)?(ba|da)?sh\b", head):
                    out.append(f)
    return out


def _doc(family: str, key: str, text: str, min_chars: int = 400) -> Optional[dict]:
    text = strip_licences(text.replace("\r\n", "\n"))
    if len(text) < min_chars:
        return None
    split_key = f"{family}:{key}"
    held = _held_out(Path(key).name) or Path(key).parts[0].startswith(HELD_OUT_PREFIXES)   # a page, or git's folder
    return {"id": split_key, "split_key": split_key, "family": family, "text": text,
            "split": "eval" if held or is_eval(split_key) else "train"}


def collect(caps: Optional[dict] = None, workers: int = 4, log=print) -> List[dict]:
    """Every corpus document, family by family, each family cut at its character cap (hash order)."""
    caps = dict(DEFAULT_CAPS, **(caps or {}))
    out = []
    jobs = (("man", man_pages, lambda f: f.name.removesuffix(".gz"), None),
            ("doc", doc_files, lambda f: f.relative_to(DOC_ROOT).as_posix(), _read),
            ("c", header_files, lambda f: f.relative_to(INCLUDE_ROOT).as_posix(), _read),
            ("sh", script_files, lambda f: f.as_posix().lstrip("/"), _read))
    for family, lister, key, reader in jobs:
        files = sorted(lister(), key=lambda f: (_h(f"{family}:order:{f}"), str(f)))
        total, docs = 0, []
        with ThreadPoolExecutor(workers) as pool:
            # in chunks: rendering stops near the cap instead of after every listed file
            for i in range(0, len(files), 8 * workers):
                chunk = files[i:i + 8 * workers]
                for f, text in zip(chunk, pool.map(render_man if reader is None else reader, chunk)):
                    d = _doc(family, key(f), text) if text else None
                    if d is None or total >= caps[family]:
                        continue
                    docs.append(d)
                    total += len(d["text"])
                if total >= caps[family]:
                    break
        log(f"{family}: {len(docs)} documents of {len(files)} files, {total / 1e6:.1f}M characters, "
            f"{sum(d['split'] == 'eval' for d in docs)} held out")
        out += docs
    return out


def write_corpus(path, docs: Sequence[dict]) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_corpus(paths) -> List[dict]:
    """The documents of one or more corpus files (parts of one corpus may be given in any order)."""
    out = []
    for p in [paths] if isinstance(paths, (str, Path)) else paths:
        p = Path(p)
        if not p.is_file():
            raise FileNotFoundError(f"corpus file not found: {p}")
        with lzma.open(p, "rt", encoding="utf-8") as f:
            out += [json.loads(line) for line in f if line.strip()]
    bad = [d.get("id") for d in out if d.get("family") not in FAMILIES or d.get("split") not in ("train", "eval")]
    if bad:
        raise ValueError(f"corpus documents with an unknown family or split: {bad[:3]}")
    return sorted(out, key=lambda d: d["id"])


def stream_pieces(tokenizer, docs: Iterable[dict], seq_len: int, max_tokens: int) -> List[List[int]]:
    """Documents concatenated (as the benchmarks' long prompts are) and cut into seq_len-token pieces,
    at most max_tokens in all: every position 0..seq_len-1 is trained equally often."""
    out, buf, total = [], [], 0
    for d in docs:
        buf += tokenizer.encode(d["text"] + "\n\n")
        while len(buf) >= seq_len and total + seq_len <= max_tokens:
            out.append(buf[:seq_len])
            buf, total = buf[seq_len:], total + seq_len
        if total + seq_len > max_tokens:
            break
    return out


def corpus_pieces(tokenizer, docs: Sequence[dict], split: str, seq_len: int, max_tokens: int,
                  shares: Optional[dict] = None) -> List[List[int]]:
    """Plain-text pieces of one side of the split, max_tokens split over the families by `shares`."""
    shares = shares or {"man": 0.55, "doc": 0.2, "c": 0.15, "sh": 0.1}
    out = []
    for fam, share in shares.items():
        fam_docs = [d for d in docs if d["family"] == fam and d["split"] == split]
        fam_docs.sort(key=lambda d: (_h("stream:" + d["id"]), d["id"]))
        out += stream_pieces(tokenizer, fam_docs, seq_len, int(max_tokens * share))
    return out


_DOC_CHAT = (
    "{text}\n\nWhat is the text above about? Answer in a few sentences.",
    "Summarize the following document:\n\n{text}",
    "{text}\n\nExplain the main points of this text to a beginner.",
    "Read the following text and list its key points.\n\n{text}",
    "{text}\n\nWrite a short example that shows how to use what the text above describes.",
    "Continue the following text:\n\n{text}",
)
_CODE_CHAT = (
    "Explain what the following code does:\n\n```\n{text}\n```",
    "{text}\n\nWhat is this file for? Answer briefly.",
    "Review the following code and suggest improvements:\n\n```\n{text}\n```",
    "Continue the following code:\n\n```\n{text}\n```",
)


def corpus_prompts(docs: Sequence[dict], split: str, limit: int, max_chars: int = 6000) -> List[dict]:
    """Chat prompts over document pieces (the target answers them: self-distillation), one per piece,
    families interleaved in a hash order."""
    out = []
    for d in docs:
        if d["split"] != split:
            continue
        tpl = _CODE_CHAT if d["family"] in ("c", "sh") else _DOC_CHAT
        for i, chunk in enumerate(_chunks(d["text"], max_chars)[:3]):
            out += _prompt(f"{d['id']}:{i}", d["split_key"], d["family"], tpl, text=chunk)
    out.sort(key=lambda p: (_h("corpus-order:" + p["id"]), p["id"]))
    return out[:limit]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=".stage/corpus")
    p.add_argument("--parts", type=int, default=2, help="files to write (each carried on its own)")
    p.add_argument("--workers", type=int, default=4)
    a = p.parse_args(argv)
    docs = collect(workers=a.workers)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(a.parts):
        write_corpus(out / f"corpus.part{i}.jsonl.xz", docs[i::a.parts])
    manifest = {"documents": len(docs), "characters": {f: sum(len(d["text"]) for d in docs if d["family"] == f)
                                                       for f in FAMILIES},
                "held_out": sum(d["split"] == "eval" for d in docs),
                "files": sorted(d["id"] for d in docs)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for f in sorted(out.iterdir()):
        print(f"{f}  {f.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
