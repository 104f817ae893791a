"""The SASS lines with the most stall samples, per kernel, from `ncu -i REP --page source --csv
--print-source sass` (what scripts/gpu_route.sh keeps of a routing report). Prints the raw head of the
file when its columns are not the expected ones.  usage: python3 scripts/ncu_stalls.py SRC.csv [TOP]"""
import csv
import sys


def main(path, top=30):
    rows = list(csv.reader(open(path, errors="replace")))
    sections, head = [], None
    for r in rows:
        if not r:
            continue
        samp = [i for i, c in enumerate(r) if "Sampling" in c and "All" in c]
        if "Source" in r and samp:   # a kernel's header row
            head = r
            sections.append((head, [], samp[0]))
        elif len(r) == 1 or head is None:   # a kernel's title line, printed as it comes
            print("#", ",".join(r)[:160])
        elif len(r) == len(head):
            sections[-1][1].append(r)
    if not sections:
        print("no section with a 'Source' column and an all-samples column; the file starts:")
        for r in rows[:30]:
            print(",".join(r)[:300])
        return
    for head, body, si in sections:
        src = head.index("Source")
        tot = sum(float(r[si] or 0) for r in body) or 1.0
        extra = [i for i, c in enumerate(head) if c.startswith("stall_") or "Warp Stall" in c][:12]
        print(f"== {len(body)} SASS lines, {tot:.0f} samples; columns: {[head[i] for i in extra]}")
        for r in sorted(body, key=lambda r: -float(r[si] or 0))[:top]:
            print(f"{100 * float(r[si] or 0) / tot:5.1f}%  {r[src][:70]:70s}  " +
                  " ".join(f"{head[i][:18]}={r[i]}" for i in extra if r[i] not in ("0", "", "0.0")))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
