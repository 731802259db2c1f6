#!/usr/bin/env python3
"""notes.numbers: every number the notes and the README tag with its source still matches it.

A quoted number is tagged by an HTML comment right after it (invisible on GitHub):

    342 TFLOP/s<!-- num step=06 dtype=bf16 dim=64 causal=0 dir=fwd seq=4096 -->
    64.89<!-- num ceiling=fp32_ffma -->
    33.6 TFLOP/s<!-- num file=h200.csv step=05 dtype=fp32 dim=64 causal=0 dir=fwd seq=4096 -->

The number is the last one before the comment (digits, with optional thousands commas and a
decimal part; a sign, ×, % or unit may sit between). The tag names its source row:
  ceiling=NAME          notes/results/ceilings.csv: the newest row of that ceiling (the last in
                        the file, as tools/figures.py reads it) measured on the GPU named by
                        gpu=TEXT (a part of the gpu column; default H100, the GPU the notes
                        quote); column `value`.
  file=NAME.csv|.tsv    a results file in notes/results (default h100.csv); every other key is
                        a column of it that the row must match, with these shorthands:
                          dir=D   direction=D
                          seq=N   seq_q=N and seq_k=N
                        and, for a file with batch/heads columns, the flash-attention shape when
                        they are not given: batch = 16384 / seq, heads = heads_kv = 2048 / dim;
                        dropout=0 and density=1 unless given; commit=C pins the run.
  field=COLUMN          the column quoted (default tflops; `value` for a ceiling).
  over=STEP             a ratio: the row's field over that of STEP (a peer, e.g. torch-cudnn) at
                        the same point, from the same commit (the README's pairing).
With several matching rows the last in the file wins (the newest measurement, as figures.py).
The quoted number must equal the source rounded to as many decimals as the quote shows.

  check_numbers.py [ROOT]      report every tag whose number no longer matches; exit 1 if any,
                               or if no document holds a tag at all
  check_numbers.py [ROOT] --list   print every tag with its source value
"""
import csv
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 and not sys.argv[1].startswith("-") \
    else Path(__file__).resolve().parents[2]
RESULTS = ROOT / "notes" / "results"
TOKENS, HIDDEN = 16384, 2048  # the flash-attention benchmark shapes (tools/figures.py)
TAG = re.compile(r"<!--\s*num\s+([^>]*?)\s*-->")
NUMBER = re.compile(r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?=[^\d]{0,12}$)")


def documents():
    """Every Markdown file that quotes measurements: the notes, every results README and log
    (notes/results and its folders), the package's note, the contract, the step READMEs and the
    README."""
    docs = sorted((ROOT / "notes").glob("*.md")) + sorted((ROOT / "notes" / "results").rglob("*.md"))
    docs += [ROOT / "python" / "NOTE.md"] + sorted((ROOT / "docs").glob("*.md"))
    docs += sorted((ROOT / "steps").glob("*/README.md"))
    return docs + [ROOT / "README.md"]


# Results files that were copied from the notes rather than measured: a tag pointing at one
# would check the notes against themselves.
TRANSCRIBED = {"cpu-zen3.tsv"}


_cache = {}
_normed = {}
_by_id = {}
_by_step = {}


def rows(name):
    if name not in _cache:
        path = RESULTS / name
        with open(path, newline="", encoding="utf-8") as f:
            _cache[name] = list(csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ","))
    return _cache[name]


def norm(column, value):
    v = str(value).strip()
    if column == "step" and v.split("/")[0].isdigit():
        head, _, tail = v.partition("/")
        return head.zfill(2) + ("/" + tail if tail else "")
    try:
        return repr(float(v))
    except ValueError:
        return v


def source(keys):
    """The value a tag points at, or raises ValueError saying why there is none."""
    if "ceiling" in keys:
        gpu = keys.get("gpu", "H100")
        found = [r for r in rows("ceilings.csv") if r["ceiling"].strip() == keys["ceiling"]]
        found = [r for r in found if r["value"].strip() not in ("", "-") and gpu in r["gpu"]]
        if not found:
            raise ValueError(f"no ceiling '{keys['ceiling']}' of a {gpu} in ceilings.csv")
        return float(found[-1][keys.get("field", "value")])
    keys = dict(keys)
    name = keys.pop("file", "h100.csv")
    if name in TRANSCRIBED:
        raise ValueError(f"{name} was transcribed from the notes, not measured: a tag must point "
                         "at a measurement")
    field = keys.pop("field", "tflops")
    over = keys.pop("over", None)
    table = rows(name)
    columns = table[0].keys() if table else []
    want = {}
    for k, v in keys.items():
        if k == "dir":
            want["direction"] = v
        elif k == "seq" and "seq" not in columns:
            want["seq_q"] = want["seq_k"] = v
        else:
            want[k] = v
    if "batch" in columns and "seq_q" in want and "batch" not in want:
        want["batch"] = str(max(1, TOKENS // int(want["seq_q"])))
    if "heads" in columns and "dim" in want and "heads" not in want:
        want["heads"] = want.setdefault("heads_kv", str(HIDDEN // int(want["dim"])))
    for k, default in (("dropout", "0"), ("density", "1")):
        if k in columns and k not in want:
            want[k] = default
    unknown = [k for k in want if k not in columns]
    if unknown:
        raise ValueError(f"{name} has no column {', '.join(unknown)}")

    if name not in _normed:  # each row's values normalised once
        _normed[name] = [
            {k: norm(k, v if (v or "").strip() else {"dropout": "0", "density": "1"}.get(k, ""))
             for k, v in r.items()} for r in table]
        _by_id[name] = {id(r): n for r, n in zip(table, _normed[name])}
    normed, by_id = _normed[name], _by_id[name]

    def match(r, w):
        n = by_id[id(r)]
        return all(n[k] == norm(k, v) for k, v in w.items())

    def candidates(w):  # the rows of that step only, when the tag names one
        if "step" not in w or "step" not in columns:
            return table
        index = _by_step.setdefault(name, {})
        if not index:
            for r, n in zip(table, normed):
                index.setdefault(n["step"], []).append(r)
        return index.get(norm("step", w["step"]), [])

    found = [r for r in candidates(want) if match(r, want)]
    if not found:
        raise ValueError(f"no row of {name} matches {want}")
    if over is None:
        return float(found[-1][field])
    for r in reversed(found):  # the newest rung row whose peer was measured in the same call
        peer = dict(want, step=over, commit=r["commit"])
        same = [p for p in candidates(peer) if match(p, peer)]
        if same:
            return float(r[field]) / float(same[-1][field])
    raise ValueError(f"no {over} row measured with any matching {want.get('step')} row")


def check(doc, listing):
    bad = []
    text = doc.read_text(encoding="utf-8")
    for line_no, line in enumerate(text.splitlines(), start=1):
        for m in TAG.finditer(line):
            try:
                keys = dict(kv.split("=", 1) for kv in m.group(1).split())
            except ValueError:
                bad.append(f"{doc.relative_to(ROOT)}:{line_no}: malformed tag '{m.group(0)}'")
                continue
            before = TAG.sub("", line[:m.start()])
            n = NUMBER.search(before)
            if not n:
                bad.append(f"{doc.relative_to(ROOT)}:{line_no}: no number before {m.group(0)}")
                continue
            quoted = n.group(1)
            decimals = len(quoted.split(".")[1]) if "." in quoted else 0
            try:
                value = source(keys)
            except (ValueError, KeyError, OSError) as e:
                bad.append(f"{doc.relative_to(ROOT)}:{line_no}: {quoted}: {e}")
                continue
            expect = f"{value:.{decimals}f}"
            if listing:
                print(f"{doc.relative_to(ROOT)}:{line_no}: {quoted} <- {value:g} ({m.group(1)})")
            if float(quoted.replace(",", "")) != float(expect):
                bad.append(f"{doc.relative_to(ROOT)}:{line_no}: quotes {quoted}, the source now "
                           f"gives {expect} ({m.group(1)})")
    return bad


def main():
    listing = "--list" in sys.argv[1:]
    bad, count = [], 0
    for doc in documents():
        if doc.is_file():
            count += len(TAG.findall(doc.read_text(encoding="utf-8")))
            bad += check(doc, listing)
    for b in bad:
        print(b)
    print(f"notes.numbers: {count} tagged numbers in {len(documents())} documents, "
          + (f"{len(bad)} no longer match their source" if bad else "every one matches its source"))
    if count == 0:  # a pattern or a path that finds nothing must not pass as "all match"
        print("notes.numbers: FAILED: no tagged number found: nothing was checked")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
