"""#13's "MAL at 8K within 10% of MAL at 2K": one mode's MAL per context over the documents of several `ssv bench
spec --aligned` runs (each file's documents numbered after the previous file's), the per-document ratios, and a
bootstrap interval over documents (the texts differ a lot: a document's ratio has ranged 0.71-2.04).

    python3 scripts/mal_by_context.py OUT.json RUN1/spec-cpu.json [RUN2/spec-cpu.json ...] [--mode 'ssv strict'] [--family F]

MAL is tokens over rounds summed over the documents (as the bench's summary rows), not a mean of ratios."""
import argparse
import json
import random


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("runs", nargs="+")
    p.add_argument("--mode", default="ssv strict")
    p.add_argument("--family", help="needed when a run holds several")
    p.add_argument("--boot", type=int, default=10000)
    a = p.parse_args()
    cells, off, families = {}, 0, set()
    for path in a.runs:
        rows = [r for r in json.load(open(path))["rows"] if r["mode"] == a.mode and a.family in (None, r["family"])]
        if not rows:
            raise SystemExit(f"{path}: no rows of mode {a.mode!r}" + (f" and family {a.family!r}" if a.family else ""))
        for r in rows:  # a run's repeats add their tokens and rounds
            t, n, same = cells.get((r["context"], off + r["doc"]), (0, 0, True))
            cells[(r["context"], off + r["doc"])] = (t + r["tokens"], n + r["rounds"],
                                                     same and r["first_diff_vs_ar"] is None)
            families.add(r["family"])
        off += 1 + max(r["doc"] for r in rows)
    if len(families) != 1:
        raise SystemExit(f"one family at a time (--family): the runs hold {sorted(families)}")
    contexts = sorted({c for c, _ in cells})
    lo, hi = contexts[0], contexts[-1]
    docs = sorted({d for _, d in cells})
    if any((c, d) not in cells for c in (lo, hi) for d in docs):
        raise SystemExit("every document needs a row at both contexts")

    def mal(c, ds):
        return sum(cells[(c, d)][0] for d in ds) / sum(cells[(c, d)][1] for d in ds)

    def change(ds):
        return mal(hi, ds) / mal(lo, ds) - 1

    rng = random.Random(0)
    boot = sorted(change([rng.choice(docs) for _ in docs]) for _ in range(a.boot))
    res = {"runs": a.runs, "mode": a.mode, "families": sorted(families), "contexts": [lo, hi], "docs": len(docs),
           "mal": {str(lo): mal(lo, docs), str(hi): mal(hi, docs)}, "change": change(docs),
           "per_doc_ratio": [mal(hi, [d]) / mal(lo, [d]) for d in docs],
           "bootstrap_5_50_95": [boot[len(boot) // 20], boot[len(boot) // 2], boot[-len(boot) // 20]],
           "bootstrap_p_below_minus_10pct": sum(b < -0.10 for b in boot) / len(boot),
           "all_identical_to_ar": all(v[2] for v in cells.values())}
    json.dump(res, open(a.out, "w"), indent=1)
    print(f"{'/'.join(res['families'])} {a.mode}: MAL {lo} -> {hi} over {len(docs)} documents "
          f"{res['mal'][str(lo)]:.3f} -> {res['mal'][str(hi)]:.3f} ({100 * res['change']:+.1f}%); per document "
          + " ".join(f"{x:.2f}" for x in res["per_doc_ratio"])
          + "; bootstrap 5/50/95% " + " / ".join(f"{100 * x:+.1f}%" for x in res["bootstrap_5_50_95"])
          + f"; identical to ar: {res['all_identical_to_ar']}")


if __name__ == "__main__":
    main()
