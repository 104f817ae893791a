"""Profile-guided adaptive planning: which speculation strategy to run, per context length and online.

Offline, a *profile* ranks strategies (tree shape, traversal, group size C, precision, refresh
schedule) per context-length bucket by their measured tokens per second, i.e. mean accepted length
over seconds per verify round (`ssv bench spec` writes one). Online, `AdaptivePlanner` starts each
bucket with the profile's best strategy and watches the accepted length of the last rounds; when
it departs from what the profile expected by more than a tolerance, the expected accepted lengths of
every strategy are rescaled by the observed/expected ratio and the bucket is re-ranked, so a text
that drafts much better or worse than the profiling texts moves to a deeper or cheaper tree.

Strict strategies never change the output, so switching between them is lossless; approximate ones
are only considered when the caller allows them.
"""
from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from ssv.spec.tree import ORDERS, TreeSpec


@dataclass(frozen=True)
class Strategy:
    """One way to speculate. refresh_every = r: routing is recomputed every r-th layer (1 = always)."""

    name: str
    tree: TreeSpec
    order: str = "pos"
    group_size: int = 4
    precision: str = "strict"
    refresh_every: int = 1
    lookup: int = 0   # a chain drafted from the context beside the tree (SpecOptions.lookup)
    spares: bool = True   # SpecOptions.spares

    def __post_init__(self):
        from ssv.attention import PRECISIONS
        if not self.name:
            raise ValueError("a strategy needs a name")
        if self.order not in ORDERS:
            raise ValueError(f"strategy {self.name!r}: traversal must be one of {ORDERS}, got {self.order!r}")
        if self.group_size not in (1, 2, 4, 8, 16):
            raise ValueError(f"strategy {self.name!r}: group size must be one of 1, 2, 4, 8, 16")
        if self.precision not in PRECISIONS:
            raise ValueError(f"strategy {self.name!r}: precision must be one of {PRECISIONS}")
        if not isinstance(self.refresh_every, int) or self.refresh_every < 1:
            raise ValueError(f"strategy {self.name!r}: refresh_every must be an int >= 1")
        if self.refresh_every > 1 and self.precision == "strict":
            raise ValueError(f"strategy {self.name!r}: reusing routing needs precision 'approx'")

    def options(self, n_layers: int):
        """The engine's SpecOptions for a target of n_layers."""
        from ssv.attention import VerifyOptions
        from ssv.engine.spec import SpecOptions
        return SpecOptions(self.tree, self.order, VerifyOptions(self.group_size, self.precision,
                                                                VerifyOptions.every(self.refresh_every, n_layers)),
                           lookup=self.lookup, spares=self.spares)

    def to_json(self) -> dict:
        d = asdict(self)
        d["tree"] = asdict(self.tree)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Strategy":
        return cls(**{**d, "tree": TreeSpec(**d["tree"])})


@dataclass(frozen=True)
class Entry:
    """A strategy's measured mean accepted length (tokens per round, bonus included) and round time."""

    strategy: Strategy
    mean_accepted_length: float
    seconds_per_round: float

    def __post_init__(self):
        if not self.mean_accepted_length >= 1.0:
            raise ValueError(f"{self.strategy.name}: mean accepted length must be >= 1, got {self.mean_accepted_length}")
        if not self.seconds_per_round > 0:
            raise ValueError(f"{self.strategy.name}: seconds per round must be > 0, got {self.seconds_per_round}")

    def tokens_per_second(self, scale: float = 1.0) -> float:
        return expected_length(self, scale) / self.seconds_per_round


def expected_length(e: Entry, scale: float) -> float:
    """The accepted length if drafting is `scale` times as good as when profiled: the drafted part
    (all but the bonus) scales, capped by what the round can accept (its deepest path + 1: the
    tree's depth, or a looked-up chain's length)."""
    return min(1.0 + (e.mean_accepted_length - 1.0) * scale, max(e.strategy.tree.depth, e.strategy.lookup) + 1.0)


@dataclass
class Profile:
    """bounds[i] is the largest context length of bucket i (ascending); entries[i] its strategies."""

    bounds: List[int]
    entries: List[List[Entry]]
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.bounds or len(self.bounds) != len(self.entries):
            raise ValueError("a profile needs one list of entries per context bucket")
        if any(b <= a for a, b in zip(self.bounds, self.bounds[1:])) or self.bounds[0] < 1:
            raise ValueError(f"bucket bounds must be positive and strictly ascending, got {self.bounds}")
        for b, es in zip(self.bounds, self.entries):
            if not es:
                raise ValueError(f"bucket <= {b} has no strategy")
            names = [e.strategy.name for e in es]
            if len(set(names)) != len(names):
                raise ValueError(f"bucket <= {b} lists a strategy twice: {names}")

    def bucket(self, context: int) -> int:
        """The bucket of a context length (longer than every bound: the last bucket)."""
        return next((i for i, b in enumerate(self.bounds) if context <= b), len(self.bounds) - 1)

    def ranked(self, bucket: int, allow_approx: bool = False, scale: float = 1.0) -> List[Entry]:
        es = [e for e in self.entries[bucket] if allow_approx or e.strategy.precision == "strict"]
        if not es:
            raise ValueError(f"bucket <= {self.bounds[bucket]} has no strict strategy (allow approx to use it)")
        return sorted(es, key=lambda e: (-e.tokens_per_second(scale), e.strategy.name))

    def to_json(self) -> dict:
        return {"bounds": self.bounds, "meta": self.meta,
                "entries": [[{"strategy": e.strategy.to_json(), "mean_accepted_length": e.mean_accepted_length,
                              "seconds_per_round": e.seconds_per_round} for e in es] for es in self.entries]}

    @classmethod
    def from_json(cls, d: dict) -> "Profile":
        try:
            entries = [[Entry(Strategy.from_json(e["strategy"]), float(e["mean_accepted_length"]),
                              float(e["seconds_per_round"])) for e in es] for es in d["entries"]]
            return cls([int(b) for b in d["bounds"]], entries, dict(d.get("meta", {})))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a speculation profile ({e!r})") from None

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path) -> "Profile":
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"profile not found: {p}")
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not JSON ({e})") from None
        try:
            return cls.from_json(doc)
        except (ValueError, KeyError, TypeError) as e:   # which file holds the bad entry
            raise ValueError(f"profile {p}: {e}") from None

    @classmethod
    def from_rows(cls, rows: Sequence[dict], strategies: dict, meta: Optional[dict] = None) -> "Profile":
        """From benchmark rows {context, mode, mean_accepted_length, tokens_per_second}: one bucket per
        measured context, holding the lengths nearer to it than to its neighbours (bounds at the
        midpoints: a 1K prompt decodes past 1,024 tokens at once, and its rounds are still the 1K
        rows' kind); `strategies` maps a mode name to its Strategy (other modes, e.g. `ar` or dense
        attention, are not strategies and are skipped). meta["contexts"]: the measured contexts."""
        by = {}
        for r in rows:
            if r["mode"] in strategies and r.get("tokens_per_second", 0) > 0:
                by.setdefault(r["context"], {}).setdefault(r["mode"], []).append(r)
        if not by:
            raise ValueError("no benchmark row names a known strategy")
        measured = sorted(by)
        bounds = [(a + b) // 2 for a, b in zip(measured, measured[1:])] + [measured[-1]]
        entries = []
        for c in measured:
            es = []
            for mode, rs in sorted(by[c].items()):
                mal = sum(r["mean_accepted_length"] for r in rs) / len(rs)
                spr = sum(r["mean_accepted_length"] / r["tokens_per_second"] for r in rs) / len(rs)
                es.append(Entry(strategies[mode], max(1.0, mal), spr))
            entries.append(es)
        return cls(bounds, entries, {**(meta or {}), "contexts": measured})


class AdaptivePlanner:
    """Chooses a strategy per round: the profile's best for the context's bucket, re-ranked when the
    observed accepted length over the last `window` rounds departs from the expected by > tolerance."""

    def __init__(self, profile: Profile, n_layers: int, allow_approx: bool = False, window: int = 8,
                 tolerance: float = 0.25):
        if window < 1:
            raise ValueError("the observation window must be >= 1 round")
        if not 0 < tolerance < 1:
            raise ValueError("tolerance must be in (0, 1)")
        self.profile, self.n_layers, self.allow_approx = profile, n_layers, allow_approx
        self.window, self.tolerance = window, tolerance
        for b in range(len(profile.bounds)):  # fail now, not when a long generation reaches the bucket
            profile.ranked(b, allow_approx)
        self.reset()

    def reset(self) -> None:
        """Forget everything observed (a new prompt starts from the profile)."""
        self.scale = 1.0              # observed / profiled drafting quality, carried across buckets
        self._bucket: Optional[int] = None
        self._entry: Optional[Entry] = None
        self._opts = None             # the current strategy's SpecOptions, built once per switch
        self.used_approx = False      # whether any round ran an approximate strategy (output may differ from AR)
        self._seen: deque = deque(maxlen=self.window)
        self.rounds = 0
        self.switches: List[dict] = []
        self.rounds_by_strategy: dict = {}

    @property
    def current(self) -> Optional[Strategy]:
        return self._entry.strategy if self._entry else None

    def choose(self, context: int):
        """SpecOptions for the next round at this context length."""
        b = self.profile.bucket(context)
        if b != self._bucket:
            self._bucket = b
            self._set(self.profile.ranked(b, self.allow_approx, self.scale)[0], "bucket", context)
        return self._opts

    def observe(self, accepted: int) -> None:
        """Tokens emitted by the last round (accepted path + bonus)."""
        if self._entry is None:
            raise RuntimeError("observe() before choose()")
        self.rounds += 1
        name = self._entry.strategy.name
        self.rounds_by_strategy[name] = self.rounds_by_strategy.get(name, 0) + 1
        self.used_approx |= self._entry.strategy.precision == "approx"
        self._seen.append(accepted)
        if len(self._seen) < self.window:
            return
        seen = sum(self._seen) / len(self._seen)
        want = expected_length(self._entry, self.scale)
        if abs(seen - want) <= self.tolerance * want:
            return
        # drafting is better/worse than profiled: rescale every strategy's drafted part and re-rank
        profiled = self._entry.mean_accepted_length - 1.0
        self.scale = (seen - 1.0) / profiled if profiled > 0 else 1.0
        self.scale = min(max(self.scale, 0.05), 20.0)
        self._seen.clear()
        best = self.profile.ranked(self._bucket, self.allow_approx, self.scale)[0]
        # on a tie the current strategy stays
        if best.tokens_per_second(self.scale) > self._entry.tokens_per_second(self.scale) * (1 + 1e-9):
            self._set(best, "acceptance", None, seen)

    def _set(self, entry: Entry, why: str, context, seen=None) -> None:
        # a new bucket's entry replaces the old one even for the same strategy (other expectations)
        if self._entry is None or entry.strategy != self._entry.strategy:
            self.switches.append({"round": self.rounds, "reason": why, "context": context, "observed_length": seen,
                                  "from": self.current.name if self._entry else None, "to": entry.strategy.name})
            self._opts = entry.strategy.options(self.n_layers)
        self._entry = entry
        self._seen.clear()

    def summary(self) -> dict:
        return {"strategy": self.current.name if self._entry else None, "scale": self.scale,
                "rounds_by_strategy": dict(self.rounds_by_strategy), "switches": self.switches}
