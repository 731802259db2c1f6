#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

  tools/stalls.py PAGE [--hot F] [--top N] [--phases ROW[=NAME],ROW[=NAME],...]

PAGE is the NAME.sass.csv that `SOURCE=1 tools/profile.sh NAME ...` writes (ncu --page source
--print-source sass --csv), or the same file gzipped (.gz): one row per SASS instruction with its
executions, its warp-stall samples by reason and, for shared-memory accesses, the wavefronts it
took against the ideal. Rows are numbered from 0 in program order, as printed.

Prints, for the "hot" instructions, those executed at least F times as often as the loop that
dominates (the execution count that accounts for the most executed instructions; default 0.9,
0 for the whole kernel):
  - the stall samples by reason. Samples whose reason has no column in the page (ncu has no
    per-instruction column for some, the wgmma "gmma" stall among them) are listed as
    "no column";
  - the samples by instruction kind (HGMMA, STSM, STS, LDSM, LDS, BAR, FENCE, SYNCS, MUFU,
    WARPGROUP, other);
  - the shared-memory accesses that take more wavefronts than ideal (bank conflicts);
  - the N instructions with the most samples, in program order, with their top reasons and the
    cumulative share of the hot samples up to and including each;
  - with --phases, the hot samples between consecutive boundary rows (a phase runs from its row
    to the next boundary; hot rows before the first boundary belong to the last phase, as a loop
    wraps round);
and, for the other instructions, their samples by execution count (code run once per item, once
per CTA, ...).

A page that cannot be read (a truncated or corrupt .gz, not UTF-8, not CSV, not an ncu source
page, a link, a FIFO or a device: tools/pathargs.py) is exit status 2 with a one-line error.
"""
import argparse
import collections
import csv
import io
import signal
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pathargs  # noqa: E402  (the path-argument rule of every tool)

KINDS = ("HGMMA", "STSM", "STS", "LDSM", "LDS", "BAR", "FENCE", "SYNCS", "MUFU", "WARPGROUP")
SAMPLES, EXECUTED = "Warp Stall Sampling (All Samples)", "Instructions Executed"
WAVES, IDEAL = "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal"


def kind(source):
    words = source.split()
    if words and words[0].startswith("@"):  # a predicate guard, not the opcode
        words = words[1:]
    base = words[0].split(".")[0] if words else ""
    return base if base in KINDS else "other"


MAX_PAGE = 1 << 30  # the largest page read, after decompression


def fail(message):
    """A one-line error, exit status 2 (bad or unreadable input, never a traceback)."""
    print(f"stalls.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def gunzip(data, limit=MAX_PAGE):
    """The members of a gzip file, decompressed up to `limit` bytes; ValueError for a file
    that is truncated, corrupt or larger than that."""
    out, rest = [], data
    while rest:
        d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            out.append(d.decompress(rest, limit + 1 - sum(map(len, out))))
        except zlib.error as e:
            raise ValueError(f"not a valid gzip file ({e})") from None
        if sum(map(len, out)) > limit:
            raise ValueError(f"larger than {limit} bytes once decompressed")
        if not d.eof:
            raise ValueError("truncated: the gzip stream ends before its last block")
        rest = d.unused_data.lstrip(b"\0")
    return b"".join(out)


def load(path):
    """The page's header and rows. Read by the path rule (tools/pathargs.py: no link, FIFO or
    device); a .gz is decompressed in memory, checked to be whole."""
    try:
        data = pathargs.read_bytes(path, "PAGE")
        if str(path).endswith(".gz"):
            data = gunzip(data)
        text = data.decode("utf-8-sig")
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except pathargs.PathError as e:
        fail(f"cannot read {e}")
    except (ValueError, csv.Error) as e:  # UnicodeDecodeError is a ValueError
        fail(f"PAGE {path}: cannot read it: {e}")
    # The page starts with a "Kernel Name" row, then the header.
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        fail(f"PAGE {path}: has no 'Address' header row (not an ncu source page?)")
    head = rows[start]
    missing = [c for c in ("Source", SAMPLES, EXECUTED) if c not in head]
    if missing:
        fail(f"PAGE {path}: lacks the columns {', '.join(missing)}")
    return head, [dict(zip(head, r)) for r in rows[start + 1:] if len(r) == len(head)]


def num(text):
    try:
        return int(str(text).replace(",", ""))
    except ValueError:
        return 0


def phase_bounds(text, hot_rows, parser):
    bounds = []
    for item in text.split(","):
        row, _, name = item.partition("=")
        try:
            r = int(row)
        except ValueError:
            parser.error(f"--phases: '{item}' is not ROW or ROW=NAME")
        if r not in hot_rows:
            parser.error(f"--phases: row {r} is not a hot instruction")
        bounds.append((r, name.strip() or f"from row {r}"))
    if [r for r, _ in bounds] != sorted({r for r, _ in bounds}):
        parser.error("--phases: the rows must be distinct and in increasing order")
    return bounds


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("page", help="NAME.sass.csv (or .gz) from SOURCE=1 tools/profile.sh")
    ap.add_argument("--hot", type=float, default=0.9,
                    help="keep instructions executed >= HOT x the dominant loop's count "
                    "(default 0.9)")
    ap.add_argument("--top", type=int, default=30, help="instructions listed (default 30)")
    ap.add_argument("--phases", help="ROW[=NAME],...: samples between these hot rows")
    a = ap.parse_args()
    if not 0 <= a.hot <= 1:
        ap.error("--hot is a fraction, 0 to 1")
    if a.top < 0:
        ap.error("--top is a count, 0 or more")
    head, rows = load(a.page)
    if not rows:
        fail(f"PAGE {a.page}: has no instruction rows")
    reasons = [k for k in head if k.startswith("stall_") and "(Not Issued)" not in k]
    # The dominant loop: the execution count that accounts for the most executed instructions
    # (count x instructions with it); a spin loop's few instructions run more often.
    work = collections.Counter()
    for r in rows:
        work[num(r[EXECUTED])] += num(r[EXECUTED])
    work.pop(0, None)
    if not work:
        fail(f"PAGE {a.page}: has no executed instruction")
    most = work.most_common(1)[0][0]
    hot = [(i, r) for i, r in enumerate(rows) if num(r[EXECUTED]) >= a.hot * most]
    total = sum(num(r[SAMPLES]) for _, r in hot)
    everything = sum(num(r[SAMPLES]) for r in rows)
    print(f"{len(hot)} of {len(rows)} instructions executed >= {a.hot:g} x {most}: "
          f"{total} of {everything} samples")
    if total == 0:
        return

    def why(r, n):
        c = collections.Counter({k[len("stall_"):]: num(r[k]) for k in reasons})
        c["no column"] = num(r[SAMPLES]) - sum(c.values())
        return c if n is None else ", ".join(f"{k} {v}" for k, v in c.most_common(n) if v > 0)

    by_reason, by_kind = collections.Counter(), collections.Counter()
    for _, r in hot:
        by_reason.update(why(r, None))
        by_kind[kind(r["Source"].strip())] += num(r[SAMPLES])
    print("\nsamples by reason")
    for k, v in by_reason.most_common():
        if v:
            print(f"  {k:20s}{v:9d} {100 * v / total:5.1f} %")
    print("\nsamples by instruction kind")
    for k, v in by_kind.most_common():
        print(f"  {k:20s}{v:9d} {100 * v / total:5.1f} %")

    print("\nshared-memory accesses above their ideal wavefronts (per execution)")
    if WAVES not in head or IDEAL not in head:
        print("  (the page has no wavefront columns)")
    else:
        conflicts = [(i, r) for i, r in hot
                     if num(r[EXECUTED]) and num(r[WAVES]) > num(r[IDEAL])]
        for i, r in conflicts:
            e = num(r[EXECUTED])
            print(f"  {i:5d}  {num(r[WAVES]) / e:5.1f} / {num(r[IDEAL]) / e:4.1f}  "
                  f"{r['Source'].strip()[:70]}")
        if not conflicts:
            print("  none")

    cum, share = 0, {}
    for i, r in hot:
        cum += num(r[SAMPLES])
        share[i] = cum / total
    print(f"\nthe {a.top} instructions with the most samples, in program order "
          "(row, samples, cumulative share, instruction, top reasons)")
    top = sorted(hot, key=lambda ir: -num(ir[1][SAMPLES]))[:a.top]
    for i, r in sorted(top, key=lambda ir: ir[0]):
        print(f"  {i:5d} {num(r[SAMPLES]):7d} {100 * share[i]:5.1f} %  "
              f"{r['Source'].strip()[:58]:58s} {why(r, 3)}")

    if a.phases:
        bounds = phase_bounds(a.phases, {i for i, _ in hot}, ap)
        starts = [b for b, _ in bounds]
        per = collections.Counter()
        for i, r in hot:
            before = [k for k, s in enumerate(starts) if s <= i]
            per[before[-1] if before else len(starts) - 1] += num(r[SAMPLES])
        print("\nsamples by phase (first row, name)")
        for k, (row, name) in enumerate(bounds):
            print(f"  {row:5d} {per[k]:9d} {100 * per[k] / total:5.1f} %  {name}")

    cold = collections.Counter()
    for r in rows:
        if num(r[EXECUTED]) < a.hot * most:
            cold[num(r[EXECUTED])] += num(r[SAMPLES])
    if cold and sum(cold.values()):
        print(f"\nthe other instructions' samples by execution count (of {everything}; the "
              "largest five)")
        for count, s in cold.most_common(5):
            print(f"  {count:12d} x {s:9d} {100 * s / everything:5.1f} %")


if __name__ == "__main__":
    main()
