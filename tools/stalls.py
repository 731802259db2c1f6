#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

  tools/stalls.py NAME.sass.csv [--hot F] [--top N]

NAME.sass.csv is what `SOURCE=1 tools/profile.sh NAME ...` writes (ncu --page source
--print-source sass --csv): one row per SASS instruction with its executions, its warp-stall
samples by reason and, for shared-memory accesses, the wavefronts it took against the ideal.

Prints, for the instructions executed at least F times as often as the loop that dominates (the
execution count that accounts for the most executed instructions; default 0.9, 0 for the whole
kernel):
  - the stall samples by reason. Samples whose reason has no column in the page (ncu has no
    per-instruction column for some, the wgmma "gmma" stall among them) are listed as
    "no column";
  - the samples by instruction kind (HGMMA, STS, STSM, LDS, BAR, FENCE, SYNCS, MUFU, other);
  - the shared-memory accesses that take more wavefronts than ideal (bank conflicts);
  - the N instructions with the most samples, in program order, with their top reasons and the
    cumulative share of the samples up to each (the phases of the loop).
"""
import argparse
import collections
import csv
import sys

KINDS = ("HGMMA", "STSM", "STS", "LDSM", "LDS", "BAR", "FENCE", "SYNCS", "MUFU", "WARPGROUP")


def kind(source):
    op = source.split()
    op = op[1] if op and op[0].startswith("@") and len(op) > 1 else (op[0] if op else "")
    base = op.split(".")[0]
    return base if base in KINDS else "other"


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The page starts with a "Kernel Name" row, then the header.
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        sys.exit(f"stalls.py: {path} has no 'Address' header row (not an ncu source page?)")
    head = rows[start]
    need = ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed")
    missing = [c for c in need if c not in head]
    if missing:
        sys.exit(f"stalls.py: {path} lacks the columns {missing}")
    return [dict(zip(head, r)) for r in rows[start + 1:] if len(r) == len(head)]


def num(text):
    try:
        return int(text.replace(",", ""))
    except (ValueError, AttributeError):
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--hot", type=float, default=0.9,
                    help="keep instructions executed >= HOT x the dominant loop's count "
                    "(default 0.9)")
    ap.add_argument("--top", type=int, default=30, help="instructions listed (default 30)")
    a = ap.parse_args()
    if not 0 <= a.hot <= 1:
        ap.error("--hot is a fraction, 0 to 1")
    rows = load(a.csv)
    if not rows:
        sys.exit(f"stalls.py: {a.csv} has no instruction rows")
    reasons = [k for k in rows[0] if k.startswith("stall_") and "(Not Issued)" not in k]
    # The dominant loop: the execution count that accounts for the most executed instructions
    # (count x instructions with it); a spin loop's few instructions run more often.
    work = collections.Counter()
    for r in rows:
        work[num(r["Instructions Executed"])] += num(r["Instructions Executed"])
    work.pop(0, None)
    if not work:
        sys.exit(f"stalls.py: {a.csv} has no executed instruction")
    most = work.most_common(1)[0][0]
    hot = [(i, r) for i, r in enumerate(rows) if num(r["Instructions Executed"]) >= a.hot * most]
    total = sum(num(r["Warp Stall Sampling (All Samples)"]) for _, r in hot)
    everything = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    print(f"{len(hot)} of {len(rows)} instructions executed >= {a.hot:g} x {most}: "
          f"{total} of {everything} samples")
    if total == 0:
        return

    by_reason, by_kind = collections.Counter(), collections.Counter()
    for _, r in hot:
        s = num(r["Warp Stall Sampling (All Samples)"])
        named = 0
        for k in reasons:
            by_reason[k[len("stall_"):]] += num(r[k])
            named += num(r[k])
        by_reason["no column"] += s - named
        by_kind[kind(r["Source"].strip())] += s
    print("\nsamples by reason")
    for k, v in by_reason.most_common():
        if v:
            print(f"  {k:20s}{v:9d} {100 * v / total:5.1f} %")
    print("\nsamples by instruction kind")
    for k, v in by_kind.most_common():
        print(f"  {k:20s}{v:9d} {100 * v / total:5.1f} %")

    print("\nshared-memory accesses above their ideal wavefronts (per execution)")
    any_conflict = False
    for i, r in hot:
        e = num(r["Instructions Executed"])
        w, ideal = num(r.get("L1 Wavefronts Shared", "0")), num(r.get("L1 Wavefronts Shared Ideal", "0"))
        if e and w > ideal:
            any_conflict = True
            print(f"  {i:5d}  {w / e:5.1f} / {ideal / e:4.1f}  {r['Source'].strip()[:70]}")
    if not any_conflict:
        print("  none")

    print(f"\nthe {a.top} instructions with the most samples, in program order "
          "(row, samples, cumulative share, instruction, top reasons)")
    cum, share = 0, {}
    for i, r in hot:
        cum += num(r["Warp Stall Sampling (All Samples)"])
        share[i] = cum / total
    top = sorted(hot, key=lambda ir: -num(ir[1]["Warp Stall Sampling (All Samples)"]))[:a.top]
    for i, r in sorted(top, key=lambda ir: ir[0]):
        c = collections.Counter({k[len("stall_"):]: num(r[k]) for k in reasons})
        s = num(r["Warp Stall Sampling (All Samples)"])
        c["no column"] = s - sum(c.values())
        why = ", ".join(f"{k} {v}" for k, v in c.most_common(3) if v > 0)
        print(f"  {i:5d} {s:7d} {100 * share[i]:5.1f} %  {r['Source'].strip()[:58]:58s} {why}")


if __name__ == "__main__":
    main()
