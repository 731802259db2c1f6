#!/usr/bin/env python3
"""Figures and the README's results table, regenerated from the results files.

  python3 tools/figures.py [--results DIR] [--figures DIR] [--readme FILE] [--steps DIR]

reads the results files DIR/*.csv (default notes/results; one per GPU, written by `ladder bench
--csv` and tools/peers.py --csv; schema in docs/CONTRACT.md, with or without the columns
dropout,density,run: rows without them are dense and without dropout, and their run is
commit:<commit>), the measured ceilings
DIR/ceilings.csv (written by tools/ceilings.cu) and, where present, the rung-07 trace
DIR/<gpu>-trace-07.csv, and writes, for each results file <gpu>.csv:
  <gpu>_tflops_<dtype>.svg|png  TFLOP/s against sequence length, each rung next to the PyTorch
                                peers of the same dtype, under the measured compute ceilings
  <gpu>_roofline.svg|png        every GPU rung and peer under the measured ceilings
  <gpu>_roofline_<NN>.svg|png   the same with rung NN highlighted, for each NN whose note embeds
                                it (notes/*.md; a note's roofline picks out the note's rung)
  <gpu>_workspace.svg|png       workspace bytes against sequence length
  <gpu>_sparsity.svg|png        time against block density: block-sparse rungs and torch-flex
  <gpu>_dropout.svg|png         TFLOP/s with dropout over TFLOP/s without, same shape and run,
                                from the files of the current dropout scheme (DROPOUT_RESULTS
                                below --results, e.g. dropout-h200/dropout-454cbb6.csv) for the
                                GPU that measured them
  <gpu>_timeline_<variant>.svg|png  the rung-07 trace: one row per warp, one bar per phase
into the figures folder (default notes/figures), and the table between <!-- results:begin -->
and <!-- results:end --> in the README. The first three figures and the table use the dense rows
without dropout. A ceiling is the newest row (the last in the file) of that name for the results
file's GPU; with none, no ceiling line is drawn and the figure says so. With no results yet it
writes that in the README and exits 0. A ratio of a rung to a peer (the README table) takes both
rows from one run (the run column: one invocation of tools/gpu_check.sh, which times the rungs
and the peers side by side), and so does the dropout figure's ratio of a kernel at p to itself
at p = 0 (the median over the runs of its file). Rows from before run ids have run
commit:<commit>: they pair by commit, the latest such peer row. Nothing here is typed by hand:
every number comes from the CSV files. The figures need matplotlib (Debian: python3-matplotlib);
the README table does not.

The step READMEs' measured tables (between <!-- step-results:begin --> and <!-- step-results:end
--> in STEPS/NN_*/README.md) are regenerated from the same rows: STEPS is --steps, by default the
repository's steps/ when --readme is the repository's README.md and none otherwise (a --readme
elsewhere never rewrites the repository's step READMEs).

Paths (tools/pathargs.py): an empty path, a symbolic link, a FIFO, a device or a socket is refused
(exit 2) wherever a path is given or read, the *.csv files of --results included. Every output
(figures, README, step READMEs) is made in memory first and written only when all of them are
made, each to a temporary file beside it that is then renamed over the old one: a failure (a
read-only folder, a full disk, a file refused) leaves every file as it was. A row that is not of
the schema (a size below 1, a value not finite, ...) is skipped with its line number. Text from
the CSV files is escaped where it is written into Markdown. Exit status: 0 written (or nothing
to change), 2 a path refused, a file that cannot be read or written, or no usable row.
"""
import argparse
import csv
import importlib.util
import io
import math
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import pathargs  # noqa: E402  (the path-argument rule of every tool)
from pathargs import PathError, md_code, md_target, md_text  # noqa: E402
COLUMNS = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
           "workspace_bytes,gpu,cuda,commit").split(",")
# Added later to the schema: rows of older files have no dropout and are dense.
OPTIONAL_COLUMNS = {"dropout": 0.0, "density": 1.0}
CEILINGS_FILE = "ceilings.csv"
CEILING_COLUMNS = "gpu,cuda,commit,ceiling,value,unit,method".split(",")
TRACE_COLUMNS = "variant,warp,role,phase,tile,t0_ns,t1_ns".split(",")
# The dropout figure's rows: the committed measurements of the current dropout scheme (8-bit
# uniforms, one Philox call per 16 x 32 block: docs/CONTRACT.md), under --results, oldest first.
# A rung's or peer's series comes from the newest file that has it (rung 06 from 73735f8, rung 07
# and torch-flash from 454cbb6). Dropout rows of <gpu>.csv are of the older 16-bit scheme and are
# not drawn.
DROPOUT_RESULTS = ("dropout-h200/dropout-73735f8.csv", "dropout-h200/dropout-454cbb6.csv")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

# flash-attention's benchmark shapes: B*N = 16384 tokens, H*d = 2048.
TOKENS, HIDDEN = 16384, 2048
TABLE_SEQ = 4096
# The peer a rung's README ratio is taken against, by the rung's dtype.
TABLE_PEER = {"fp32": "torch-efficient", "bf16": "torch-flash", "fp16": "torch-flash"}
# A rung whose target peer is not its dtype's: the Hopper rung is held to cuDNN's attention.
TABLE_PEER_BY_STEP = {"07": "torch-cudnn"}
# The ceiling a rung's variant ladder is drawn against (notes/results/ceilings.csv names).
RUNG_CEILING = {"05": "fp32_ffma", "06": "mma_sync_bf16", "07": "wgmma_bf16"}
CPU_RUNGS = {"00", "01", "02"}  # the roofline's ceilings are a GPU's: CPU rungs stay off it

PEER_STYLE = {  # colour, line style
    "torch-flash": ("#000000", "--"),
    "torch-cudnn": ("#6b6b6b", "-."),
    "torch-efficient": ("#8c564b", ":"),
    "torch-math": ("#9467bd", (0, (1, 3))),
    "torch-flex": ("#2f4b7c", (0, (5, 2, 1, 2))),
}
RUNG_COLOR = {"00": "#7f7f7f", "01": "#bcbd22", "02": "#17becf", "03": "#d62728",
              "04": "#ff7f0e", "05": "#2ca02c", "06": "#1f77b4", "07": "#d81b60"}


class Row:
    __slots__ = COLUMNS + list(OPTIONAL_COLUMNS) + ["run"]

    def key(self):
        return (self.step, self.dtype, self.batch, self.heads, self.heads_kv, self.seq_q,
                self.seq_k, self.dim, self.causal, self.direction, self.dropout, self.density)

    def shape(self):
        return (self.dtype, self.batch, self.heads, self.heads_kv, self.seq_q, self.seq_k,
                self.dim, self.causal)

    @property
    def plain(self):
        """Dense and without dropout: the rows of the first figures and the README table."""
        return self.dropout == 0 and self.density == 1

    @property
    def peer(self):
        return self.step.startswith("torch-")

    @property
    def variant(self):
        """A non-default variant's row ("06/baseline"): only the variant-ladder figure uses it."""
        return "/" in self.step

    @property
    def flash_shape(self):
        return (self.seq_q == self.seq_k and self.heads == self.heads_kv and
                self.batch == max(1, TOKENS // self.seq_q) and
                self.heads == max(1, HIDDEN // self.dim))


def parse_row(d):
    r = Row()
    step = d["step"].strip()
    r.step = step.zfill(2) if step.isdigit() else step  # "5" and "05" are the same rung
    r.dtype = d["dtype"].strip()
    for c in ("batch", "heads", "heads_kv", "seq_q", "seq_k", "dim", "causal"):
        setattr(r, c, int(d[c]))
        if c != "causal" and getattr(r, c) < 1:
            raise ValueError(f"{c} = {d[c]} (a size is at least 1)")
    if r.causal not in (0, 1):
        raise ValueError(f"causal = {d['causal']} (0 or 1)")
    r.direction = d["direction"].strip()
    if r.direction not in ("fwd", "bwd"):
        raise ValueError(f"direction '{r.direction}'")
    for c in ("ms", "tflops", "gbps", "workspace_bytes"):
        v = float(d[c])
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{c} = {d[c]}")
        setattr(r, c, v)
    for c in ("gpu", "cuda", "commit"):
        setattr(r, c, (d.get(c) or "-").strip() or "-")
    for c, default in OPTIONAL_COLUMNS.items():
        text = (d.get(c) or "").strip()
        setattr(r, c, float(text) if text else default)
    if not 0 <= r.dropout < 1:
        raise ValueError(f"dropout = {r.dropout:g}")
    if not 0 <= r.density <= 1:
        raise ValueError(f"density = {r.density:g}")
    # The invocation that measured the row; before run ids, the commit is all that says so.
    r.run = (d.get("run") or "").strip() or f"commit:{r.commit}"
    return r


def csv_reader(path, arg):
    """A csv.DictReader over a file read by the path rule (a regular file, not a link, read
    without blocking and within a bound; a UTF-8 byte-order mark dropped)."""
    return csv.DictReader(io.StringIO(pathargs.read_text(path, arg), newline=""))


def load(path, latest=True):
    """The rows of one results file; for a point measured twice, the later row wins (with
    latest=False: every row, in file order, for same-call comparisons). Raises PathError for a
    file that cannot be read (a link, a FIFO, not UTF-8, not CSV)."""
    try:
        return _load(path, latest)
    except csv.Error as e:
        raise PathError(f"--results {path}: not a CSV file ({e})") from None


def _load(path, latest):
    reader = csv_reader(path, "--results")
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        print(f"figures: {path}: skipped, missing columns {', '.join(missing)}",
              file=sys.stderr)
        return []
    rows = {}
    for line, d in enumerate(reader, start=2):
        try:
            r = parse_row(d)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            print(f"figures: {path}:{line}: skipped ({e})", file=sys.stderr)
            continue
        if not latest:
            rows[(line,)] = r
            continue
        rows.pop(r.key(), None)  # re-insert: keeps file order for the newest row
        rows[r.key()] = r
    return list(rows.values())


class Ceiling:
    __slots__ = ("name", "value", "unit", "commit", "method")

    def __init__(self, name, value, unit, commit, method):
        self.name, self.value, self.unit, self.commit, self.method = (name, value, unit, commit,
                                                                      method)


def load_ceilings(path):
    """{gpu: {ceiling name: Ceiling}} from the ceilings file: for each GPU and ceiling the last
    row with a number (rows are appended, so the last is the newest commit's; a value of '-'
    is a ceiling that run could not measure, e.g. wgmma in a build without sm_90a)."""
    if pathargs.input_file(path, "--results", missing_ok=True) is None:
        return {}
    out = defaultdict(dict)
    try:
        reader = csv_reader(path, "--results")
        rows = list(reader)
    except csv.Error as e:
        raise PathError(f"--results {path}: not a CSV file ({e})") from None
    missing = [c for c in CEILING_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        print(f"figures: {path}: skipped, missing columns {', '.join(missing)}",
              file=sys.stderr)
        return {}
    for d in rows:
        try:
            value = float(d["value"])
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value > 0:
            name = (d["ceiling"] or "").strip()
            out[(d["gpu"] or "").strip()][name] = Ceiling(
                name, value, (d["unit"] or "").strip(), (d["commit"] or "-").strip(),
                (d["method"] or "").strip())
    return dict(out)


def ceilings_for(all_ceilings, rows):
    """The ceilings of the GPU a results file's GPU rows were measured on."""
    for gpu in unique(r.gpu for r in rows):
        if gpu in all_ceilings:
            return all_ceilings[gpu]
    return {}


def ceiling_source(ceil):
    commits = unique(c.commit for c in ceil.values())
    return (f"ceilings measured on this GPU by tools/ceilings.cu (commit {', '.join(commits)})"
            if ceil else "no ceilings measured for this GPU (tools/ceilings.cu): none drawn")


def rung_names():
    """'03' -> '03_naive_cuda', from the step folders, so names never drift from the tree."""
    return {d.name[:2]: d.name for d in sorted((ROOT / "steps").glob("[0-9][0-9]_*"))}


def label(step, names):
    return names.get(step, step)


def style(step):
    if step in PEER_STYLE:
        color, ls = PEER_STYLE[step]
        return dict(color=color, linestyle=ls, marker=None)
    return dict(color=RUNG_COLOR.get(step, "#333333"), linestyle="-", marker="o",
                markersize=3.5)


def seq_ticks(ax, seqs):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs)
    ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)
                        for s in seqs])
    ax.minorticks_off()


def shown(path):
    """A path from the repository root when inside it (as the README links it)."""
    path = Path(path).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def unique(values):
    return sorted({v for v in values if v not in ("", "-", "cpu")})


def order(step):
    # Rungs by number, then the peers in the order of PEER_STYLE.
    peers = list(PEER_STYLE)
    return (1, peers.index(step), step) if step in peers else (0, 0, step)


# ---------------------------------------------------------------------------------------------
# Figures


class Figure(os.PathLike):
    """A figure drawn into memory: its path (where it is published) and its bytes. Nothing is
    written until every output of the run has been made (main: one Staged publish)."""

    def __init__(self, path, data):
        self.path, self.data = Path(path), data

    def __fspath__(self):
        return os.fspath(self.path)

    def __getattr__(self, name):  # .stem, .suffix, .name, .resolve() ... of the path
        return getattr(self.path, name)

    def __str__(self):
        return str(self.path)


def save(fig, out_dir, stem, written):
    for ext in ("svg", "png"):
        path = out_dir / f"{stem}.{ext}"
        # No date in the SVG and a fixed id salt: the same CSV gives byte-identical files.
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150, bbox_inches="tight", metadata=meta)
        written.append(Figure(path, buf.getvalue()))


def legend_right(fig, ax, handles, labels, markers=None):
    """The figure's legend, right of the panels; with markers ({dim: marker}), one entry per
    head dim for the marker key."""
    handles, labels = list(handles), list(labels)
    for dim, m in (markers or {}).items():
        (h,) = ax.plot([], [], color="#444444", linestyle="none", marker=m)
        handles.append(h)
        labels.append(f"d = {dim}")
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
               fontsize=9)


def fig_tflops(plt, rows, gpu, tag, out_dir, names, written, ceil):
    """(a) TFLOP/s against seq, one panel per (direction, d, causal), per dtype."""
    flash = [r for r in rows if r.flash_shape and r.tflops > 0]
    for dtype in sorted({r.dtype for r in flash}, key=lambda t: ("fp32", "bf16", "fp16").index(t)
                        if t in ("fp32", "bf16", "fp16") else 9):
        sel = [r for r in flash if r.dtype == dtype]
        if not any(r.peer or r.step not in CPU_RUNGS for r in sel):
            continue  # e.g. the fp64 oracle alone: not a performance rung
        dirs = [d for d in ("fwd", "bwd") if any(r.direction == d for r in sel)]
        combos = sorted({(r.dim, r.causal) for r in sel})
        fig, axes = plt.subplots(len(dirs), len(combos), squeeze=False, sharex=True, sharey=True,
                                 figsize=(3.6 * len(combos) + 1.5, 3.0 * len(dirs) + 0.8))
        seqs = sorted({r.seq_q for r in sel})
        lo = min(r.tflops for r in sel)
        hi = max(r.tflops for r in sel)
        log_y = hi / lo > 100  # CPU rungs next to GPU ones: only a log axis shows both
        # The compute ceilings of this dtype's instructions: FFMA for fp32; mma.sync (rungs
        # 06 and below) and wgmma (rung 07) for 16 bit. wgmma is measured in bf16 only, so the
        # fp16 figure's wgmma line says bf16.
        wanted = {"fp32": [("fp32_ffma", "fp32 FFMA")],
                  "bf16": [("mma_sync_bf16", "mma.sync"), ("wgmma_bf16", "wgmma bf16")],
                  "fp16": [("mma_sync_fp16", "mma.sync"), ("wgmma_bf16", "wgmma bf16")]}
        ceilings = [(ceil[n].value, what) for n, what in wanted.get(dtype, []) if n in ceil]
        handles = {}
        for i, direction in enumerate(dirs):
            for j, (dim, causal) in enumerate(combos):
                ax = axes[i][j]
                pts = defaultdict(list)
                for r in sel:
                    if r.direction == direction and r.dim == dim and r.causal == causal:
                        pts[r.step].append((r.seq_q, r.tflops))
                for step in sorted(pts, key=order):
                    xy = sorted(pts[step])
                    st = style(step)
                    if len(xy) == 1 and st["marker"] is None:  # a lone point needs a marker
                        st.update(marker="s", markersize=4, markerfacecolor="white")
                    (h,) = ax.plot([x for x, _ in xy], [y for _, y in xy],
                                   label=label(step, names), **st)
                    handles.setdefault(step, h)
                for n, (value, what) in enumerate(ceilings):
                    # The first label on the left, a second on the right: close values apart.
                    ax.axhline(value, color="#999999", lw=0.8)
                    ax.text(seqs[0] if n == 0 else seqs[-1], value * (1.12 if log_y else 0.97),
                            f"{what} ceiling {value:g}", fontsize=7, color="#777777",
                            va="bottom" if log_y else "top", ha="left" if n == 0 else "right")
                seq_ticks(ax, seqs)
                if log_y:
                    ax.set_yscale("log")
                else:
                    ax.set_ylim(bottom=0)
                ax.grid(True, which="major", alpha=0.3)
                ax.set_title(f"{direction}, d = {dim}, {'causal' if causal else 'not causal'}",
                             fontsize=9)
                if j == 0:
                    ax.set_ylabel("TFLOP/s" + (" (log)" if log_y else ""))
                if i == len(dirs) - 1:
                    ax.set_xlabel("sequence length N")
        steps = sorted(handles, key=order)
        legend_right(fig, axes[0][0], [handles[s] for s in steps],
                     [label(s, names) for s in steps])
        note = "" if ceil else f"\n{ceiling_source(ceil)}"
        # Announce only the peers drawn: a GPU whose results file has no peer row says so.
        drawn = {s for s in handles if s in PEER_STYLE}
        peers = " and ".join(what for what, has in (
            ("PyTorch SDPA", drawn - {"torch-flex"}), ("FlexAttention", "torch-flex" in drawn))
            if has)
        who = (f"rungs (solid) and {peers} (dashed or dotted)" if peers else
               f"rungs only (no PyTorch peer row in {tag}.csv to draw)")
        fig.suptitle(f"{gpu}: {dtype} attention, {who}\n"
                     f"flash-attention shapes: B·N = {TOKENS}, H·d = {HIDDEN}; "
                     f"fwd FLOPs 4·B·H·N²·d (halved when causal), bwd 2.5× fwd{note}", fontsize=10)
        fig.tight_layout()
        save(fig, out_dir, f"{tag}_tflops_{dtype}", written)
        plt.close(fig)


def own_bytes(r):
    """The HBM bytes a row's rung or peer moves by its own traffic model, or None for the
    compulsory bytes the CSV's GB/s were computed from (Q, K, V read, O written; the backward
    adds dO, dQ, dK, dV). Two entries materialise the scores: step 03 writes S and P to HBM and
    reads them back, 4(2Md + 2Nd + 4MN) bytes per (batch, head) forward and 4(6Md + 4Nd + 7MN)
    backward, in fp32 (notes/03_naive_cuda.md, "Cost model"); PyTorch's math backend
    (torch-math) runs the same stages as separate kernels: S written by its GEMM and read by
    the softmax, P written and read by PV (4MN forward); backward dP written, P read for dV,
    P and dP read and dS written by the softmax's backward, dS read for dQ and for dK (7MN),
    plus the compulsory bytes. Only its fp32 rows are modelled (in 16 bit it computes in fp32
    by default, so the width of S is not the row's dtype): the roofline leaves its 16-bit rows
    off. Every other rung and peer keeps S and P on chip and moves the compulsory bytes."""
    if r.dtype != "fp32":
        return None
    m, n, d = r.seq_q, r.seq_k, r.dim
    if r.step == "03":
        per_head = (2 * m * d + 2 * n * d + 4 * m * n) if r.direction == "fwd" else \
            (6 * m * d + 4 * n * d + 7 * m * n)
        return 4.0 * r.batch * r.heads * per_head
    if r.step == "torch-math":
        compulsory = r.gbps * 1e9 * r.ms * 1e-3
        return compulsory + 4.0 * r.batch * r.heads * (4 if r.direction == "fwd" else 7) * m * n
    return None


def intensity(r):
    """A row's arithmetic intensity in FLOP per HBM byte: the conventional FLOPs (TFLOP/s x ms)
    over the rung's own bytes where it has a model that differs (own_bytes), else over the
    compulsory bytes (TFLOP/s over GB/s)."""
    own = own_bytes(r)
    if own:
        return r.tflops * 1e12 * r.ms * 1e-3 / own
    return 1e3 * r.tflops / r.gbps


def fig_roofline(plt, rows, gpu, tag, out_dir, names, written, ceil, highlight=None):
    """(b) each GPU rung and peer by arithmetic intensity: FLOPs over the bytes the rung itself
    moves (intensity: the S and P round trips of step 03 and torch-math included), against the
    measured ceilings. <tag>_roofline serves the README; with highlight (a rung's number) the
    figure is <tag>_roofline_<NN>, the same with that rung drawn bold and on top and every other
    series faded: the roofline of that rung's note. Returns False when the rung has no point."""
    sel = [r for r in rows if r.flash_shape and not r.causal and r.gbps > 0 and r.tflops > 0 and
           r.step not in CPU_RUNGS]
    # fp16 sits where bf16 does (same bytes, same mma rate): draw one of them, bf16 first.
    half = "bf16" if any(r.dtype == "bf16" for r in sel) else "fp16"
    # Peers: the fp32 ones, and the 16-bit ones step 06 is measured against (the fp32-minded
    # efficient and math backends in 16 bit would only crowd the plot).
    sel = [r for r in sel if r.dtype == "fp32" or (r.dtype == half and r.step not in
                                                    ("torch-efficient", "torch-math"))]
    if not sel or (highlight and not any(r.step == highlight for r in sel)):
        return False
    dirs = [d for d in ("fwd", "bwd") if any(r.direction == d for r in sel)]
    fig, axes = plt.subplots(1, len(dirs), squeeze=False, figsize=(6.2 * len(dirs) + 1.5, 5.0))
    ai_all = [intensity(r) for r in sel]
    hbm = ceil["hbm_copy"].value if "hbm_copy" in ceil else None
    peaks = [(ceil[n].value, what) for n, what in (
        ("fp32_ffma", "fp32 FFMA"), (f"mma_sync_{half}", f"mma.sync {half}"),
        ("wgmma_bf16", "wgmma bf16")) if n in ceil]
    ridges = [p / hbm for p, _ in peaks] if hbm else []  # where each roof meets the slope
    x_lo = min(ai_all + ridges) / 3
    x_hi = max(ai_all + ridges) * 3
    dims = sorted({r.dim for r in sel})
    markers = {d: "osD^v<>"[i % 7] for i, d in enumerate(dims)}
    handles = {}
    for ax, direction in zip(axes[0], dirs):
        # Ceilings: bandwidth hbm * AI up to the highest compute peak, each peak flat from
        # where it meets that slope (from the left edge when no bandwidth was measured).
        if hbm:
            xs = [x_lo, max(ridges) if ridges else x_hi]
            ax.plot(xs, [hbm * x for x in xs], color="#444444", lw=1)
            ax.text(x_lo * 1.3, hbm * x_lo * 1.3 * 1.25, f"HBM {hbm:g} TB/s",
                    rotation=0, fontsize=8, color="#444444")
        for peak, what in peaks:
            ax.plot([peak / hbm if hbm else x_lo, x_hi], [peak, peak], color="#444444", lw=1)
            ax.text(x_hi / 1.1, peak * 1.08, f"{what} {peak:g} TFLOP/s", ha="right",
                    fontsize=8, color="#444444")
        series = defaultdict(list)
        for r in sel:
            if r.direction == direction:
                series[(r.step, r.dtype, r.dim)].append((intensity(r), r.tflops))
        for (step, dtype, dim), pts in sorted(series.items(), key=lambda kv: (order(kv[0][0]),
                                                                              kv[0][1:])):
            pts.sort()
            st = style(step)
            # The note's own rung bold and on top; the rest faded behind it.
            mine = highlight is not None and step == highlight
            faded = highlight is not None and not mine
            (h,) = ax.plot([x for x, _ in pts], [y for _, y in pts], color=st["color"],
                           linestyle=st["linestyle"], lw=2.2 if mine else 0.8,
                           marker=markers[dim], markersize=7 if mine else 4,
                           markerfacecolor="white" if step in PEER_STYLE else st["color"],
                           alpha=0.3 if faded else 1.0, zorder=5 if mine else 2)
            handles.setdefault((step, dtype), h)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(x_lo, x_hi)
        ax.set_ylim(bottom=min(r.tflops for r in sel) / 3,
                    top=max([r.tflops for r in sel] + [p for p, _ in peaks]) * 2)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(f"{direction} (not causal)", fontsize=9)
        ax.set_xlabel("arithmetic intensity, FLOPs / HBM bytes the rung moves")
        ax.set_ylabel("TFLOP/s")
    keys = sorted(handles, key=lambda k: (order(k[0]), k[1]))
    labels = [f"{label(s, names)} ({t})" + ("  ← this note" if s == highlight else "")
              for s, t in keys]
    legend_right(fig, axes[0][0], [handles[k] for k in keys], labels, markers)
    mark = (f"{label(highlight, names)} highlighted (bold), every other series faded; "
            if highlight else "")
    # Say only what is drawn: the peers, and the bytes models of the entries present.
    drawn = {s for s, _ in handles}
    who = ("filled: ladder rungs; open: PyTorch SDPA" if drawn & set(PEER_STYLE) else
           "ladder rungs only (no PyTorch peer row)")
    materialise = [label(s, names) if s in names else s for s in ("03", "torch-math")
                   if s in drawn]
    if materialise:
        model = (f"bytes: S and P written and read back for {' and '.join(materialise)}, which "
                 "materialise them (step 03's note's model); the compulsory Q, K, V, O for "
                 "the fused others")
    else:
        model = "bytes: the compulsory Q, K, V, O (every entry keeps S and P on chip)"
    fig.suptitle(f"{gpu}: roofline, {mark}flash-attention shapes, seq {min(r.seq_q for r in sel)}…"
                 f"{max(r.seq_q for r in sel)} left to right\n{who}; fp32 and {half}; "
                 f"{ceiling_source(ceil)}\n{model}",
                 fontsize=10)
    fig.tight_layout()
    save(fig, out_dir, f"{tag}_roofline" + (f"_{highlight}" if highlight else ""), written)
    plt.close(fig)
    return True


def roofline_highlights(notes_dir, tag):
    """The rungs whose highlighted roofline a note embeds (![...](figures/<tag>_roofline_NN.svg)
    in notes/*.md): each note shows its own rung picked out, and no such figure is drawn that
    no note shows."""
    wanted = set()
    pattern = re.compile(r"!\[[^\]]*\]\(figures/" + re.escape(tag) + r"_roofline_(\d\d)\.svg\)")
    for note in sorted(Path(notes_dir).glob("*.md")):
        try:
            text = pathargs.read_text(note, "notes")
        except PathError as e:  # a note that cannot be read asks for no figure
            print(f"figures: warning: {e}", file=sys.stderr)
            continue
        wanted.update(pattern.findall(text))
    return sorted(wanted)


def fig_workspace(plt, rows, gpu, tag, out_dir, names, written):
    """(c) workspace bytes against seq: O(N^2) for the naive rung, O(N) or none for the rest."""
    sel = [r for r in rows if r.flash_shape and not r.peer and not r.causal]
    if not sel:
        return
    # One dtype per rung (its first in fp32, bf16, fp16 order): fp16 and bf16 use the same.
    pref = {"fp32": 0, "bf16": 1, "fp16": 2}
    dtype_of = {}
    for r in sorted(sel, key=lambda r: pref.get(r.dtype, 9)):
        dtype_of.setdefault(r.step, r.dtype)
    dirs = [d for d in ("fwd", "bwd") if any(r.direction == d for r in sel)]
    dims = sorted({r.dim for r in sel})
    markers = {d: "osD^v<>"[i % 7] for i, d in enumerate(dims)}
    seqs = sorted({r.seq_q for r in sel})
    fig, axes = plt.subplots(1, len(dirs), squeeze=False, sharey=True,
                             figsize=(5.2 * len(dirs) + 1.8, 4.4))
    handles = {}
    positive = [r.workspace_bytes for r in sel if r.workspace_bytes > 0]
    for ax, direction in zip(axes[0], dirs):
        # References from the shapes: one fp32 N x N matrix per (batch, head), and one fp32
        # vector of N per (batch, head). With B*N fixed, B*H*N^2 grows like N, B*H*N is flat.
        heads = HIDDEN // max(dims)
        ref_n2 = [max(1, TOKENS // n) * heads * n * n * 4 for n in seqs]
        ref_n = [max(1, TOKENS // n) * heads * n * 4 for n in seqs]
        for ref, ls, what in ((ref_n2, "--", "N×N"), (ref_n, ":", "N")):
            ax.plot(seqs, ref, color="#999999", lw=1, linestyle=ls, zorder=1)
            ax.text(seqs[0], ref[0] / 1.25, f"one fp32 {what} per head (d = {max(dims)})",
                    fontsize=7, color="#777777", va="top")
        none = set()
        series = defaultdict(list)
        for r in sel:
            if r.direction != direction or r.dtype != dtype_of[r.step]:
                continue
            if r.workspace_bytes > 0:
                series[(r.step, r.dim)].append((r.seq_q, r.workspace_bytes))
            else:
                none.add(label(r.step, names))
        steps = sorted({s for s, _ in series}, key=order)
        for (step, dim), pts in sorted(series.items()):
            pts.sort()
            # Rungs with the same workspace overlap: earlier ones drawn wider, underneath.
            k = steps.index(step)
            (h,) = ax.plot([x for x, _ in pts], [y for _, y in pts], color=style(step)["color"],
                           lw=1.0 + 0.9 * (len(steps) - 1 - k), marker=markers[dim],
                           markersize=3.0 + 0.8 * (len(steps) - 1 - k), zorder=2 + k)
            handles.setdefault(step, h)
        if none:
            ax.text(0.02, 0.02, "no workspace: " + ", ".join(sorted(none)),
                    transform=ax.transAxes, fontsize=8, va="bottom")
        seq_ticks(ax, seqs)
        ax.set_yscale("log")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(f"{direction} (not causal)", fontsize=9)
        ax.set_xlabel("sequence length N")
    axes[0][0].set_ylabel("workspace, bytes (beyond inputs and outputs)")
    if positive:
        axes[0][0].set_ylim(bottom=min(positive + ref_n) / 4)
    steps = sorted(handles, key=order)
    legend_right(fig, axes[0][0], [handles[s] for s in steps], [label(s, names) for s in steps],
                 markers)
    fig.suptitle(f"{gpu}: workspace, flash-attention shapes (B·N = {TOKENS} fixed, so "
                 "materialising S grows like N here, per-row state stays flat)", fontsize=10)
    fig.tight_layout()
    save(fig, out_dir, f"{tag}_workspace", written)
    plt.close(fig)


def shape_title(r):
    """A panel's title: the shape, B and H only where they are not the flash-attention ones."""
    bh = "" if r.flash_shape else f"B = {r.batch}, H = {r.heads}, "
    seq = f"N = {r.seq_q}" if r.seq_q == r.seq_k else f"M = {r.seq_q}, N = {r.seq_k}"
    return f"{r.dtype}, {bh}{seq}, d = {r.dim}, {'causal' if r.causal else 'not causal'}"


def fig_sparsity(plt, rows, gpu, tag, out_dir, names, written):
    """(d) time against block density: the block-sparse rungs and torch-flex at the same shapes,
    with each series' dense time (density 1) where measured; the dotted line from it to the
    origin is time proportional to the blocks computed."""
    sparse = [r for r in rows if not r.peer and r.step not in CPU_RUNGS and r.density < 1 and
              r.dropout == 0]
    if not sparse:
        return
    steps = {r.step for r in sparse} | {"torch-flex"}
    shapes = sorted({r.shape() for r in sparse})
    sel = [r for r in rows if r.dropout == 0 and r.step in steps and r.shape() in shapes]
    dirs = [d for d in ("fwd", "bwd") if any(r.direction == d for r in sel)]
    fig, axes = plt.subplots(len(dirs), len(shapes), squeeze=False,
                             figsize=(3.8 * len(shapes) + 1.8, 3.2 * len(dirs) + 0.8))
    handles = {}
    for i, direction in enumerate(dirs):
        for j, shape in enumerate(shapes):
            ax = axes[i][j]
            series = defaultdict(list)
            for r in sel:
                if r.direction == direction and r.shape() == shape:
                    series[r.step].append((r.density, r.ms))
            for step in sorted(series, key=order):
                pts = sorted(series[step])
                st = style(step)
                (h,) = ax.plot([x for x, _ in pts], [y for _, y in pts], color=st["color"],
                               linestyle=st["linestyle"], marker="o" if not step.startswith(
                                   "torch-") else "s", markersize=4,
                               markerfacecolor="white" if step in PEER_STYLE else st["color"])
                handles.setdefault(step, h)
                if pts[-1][0] == 1:
                    ax.plot([0, 1], [0, pts[-1][1]], color=st["color"], lw=0.7, linestyle=":")
            ax.set_xlim(0, 1.04)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            example = next(r for r in sel if r.shape() == shape)
            ax.set_title(f"{direction}, {shape_title(example)}", fontsize=8)
            if j == 0:
                ax.set_ylabel("time, ms")
            if i == len(dirs) - 1:
                ax.set_xlabel("block density (kept blocks / all)")
    keys = sorted(handles, key=order)
    legend_right(fig, axes[0][0], [handles[k] for k in keys], [label(k, names) for k in keys])
    fig.suptitle(f"{gpu}: block-sparse attention, time against the density of the block mask\n"
                 "filled: ladder rungs; open: FlexAttention on the same mask; dotted: time "
                 "proportional to the blocks computed, from the dense time", fontsize=10)
    fig.tight_layout()
    save(fig, out_dir, f"{tag}_sparsity", written)
    plt.close(fig)


def dropout_series(results):
    """{(step, dtype): (path, rows)}: each rung's and peer's rows (every pass, file order) from
    the newest of the DROPOUT_RESULTS files under --results that has dropout rows of it. A file
    that is not there is skipped; a link, a FIFO or a folder in its place is refused."""
    chosen = {}
    for name in DROPOUT_RESULTS:
        path = results / name
        if not os.path.lexists(path.parent):
            continue
        pathargs.input_dir(path.parent, "--results")
        if pathargs.input_file(path, "--results", missing_ok=True) is None:
            continue
        series = defaultdict(list)
        for r in load(path, latest=False):
            if not r.variant and r.density == 1 and r.tflops > 0 and \
                    (r.peer or r.step not in CPU_RUNGS):
                series[(r.step, r.dtype)].append(r)
        for key, rs in series.items():
            if any(r.dropout > 0 for r in rs):
                chosen[key] = (path, rs)
    return chosen


def fig_dropout(plt, series, gpu, tag, out_dir, names, written):
    """(e) the cost of dropout in the current scheme (DROPOUT_RESULTS): each GPU rung's and
    peer's TFLOP/s with dropout p over its own TFLOP/s at p = 0, same shape and same run (one
    pass of tools/alternate.sh), the median over the runs, against seq."""
    # (direction, dim, causal) -> {((step, dtype), p, seq): [ratio of each run]}
    ratios = defaultdict(lambda: defaultdict(list))
    commits, runs = {}, {}
    for (step, dtype), (path, rs) in series.items():
        if gpu not in {r.gpu for r in rs}:
            continue
        base = {(r.key()[:-2], r.run): r for r in rs if r.dropout == 0}
        for r in rs:
            b = base.get((r.key()[:-2], r.run)) if r.dropout > 0 else None
            if b is None or r.gpu != gpu:
                continue
            ratios[(r.direction, r.dim, r.causal)][((step, dtype), r.dropout, r.seq_q)].append(
                r.tflops / b.tflops)
            commits.setdefault((step, dtype), set()).add(r.commit)
            runs.setdefault((step, dtype), set()).add(r.run)
    if not ratios:
        return
    dirs = [d for d in ("fwd", "bwd") if any(k[0] == d for k in ratios)]
    combos = sorted({k[1:] for k in ratios})
    seqs = sorted({seq for pts in ratios.values() for _, _, seq in pts})
    dropouts = sorted({p for pts in ratios.values() for _, p, _ in pts})
    fig, axes = plt.subplots(len(dirs), len(combos), squeeze=False, sharex=True, sharey=True,
                             figsize=(3.6 * len(combos) + 2.6, 3.0 * len(dirs) + 1.0))
    markers = {p: "osD^v<>"[i % 7] for i, p in enumerate(dropouts)}
    handles = {}
    for i, direction in enumerate(dirs):
        for j, (dim, causal) in enumerate(combos):
            ax = axes[i][j]
            lines = defaultdict(list)
            for (key, p, seq), values in ratios.get((direction, dim, causal), {}).items():
                values = sorted(values)
                n = len(values)
                median = (values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)
                lines[(key, p)].append((seq, median))
            for (key, p) in sorted(lines, key=lambda k: (order(k[0][0]), k[0][1], k[1])):
                pts = sorted(lines[(key, p)])
                st = style(key[0])
                (h,) = ax.plot([x for x, _ in pts], [y for _, y in pts], color=st["color"],
                               linestyle=st["linestyle"], marker=markers[p], markersize=5,
                               markerfacecolor="white" if key[0] in PEER_STYLE else st["color"],
                               zorder=2 if key[0] in PEER_STYLE else 3)  # rungs on top
                handles.setdefault(key, h)
            ax.axhline(1.0, color="#999999", lw=0.8)
            seq_ticks(ax, seqs)
            ax.set_ylim(0, 1.1)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_title(f"{direction}, d = {dim}, {'causal' if causal else 'not causal'}",
                         fontsize=9)
            if j == 0:
                ax.set_ylabel("TFLOP/s with dropout / without")
            if i == len(dirs) - 1:
                ax.set_xlabel("sequence length N")
    keys = sorted(handles, key=lambda k: (order(k[0]), k[1]))
    legend_handles = [handles[k] for k in keys]
    legend_labels = [f"{label(s, names)} ({t}, commit {', '.join(sorted(commits[(s, t)]))}, "
                     f"{len(runs[(s, t)])} run{'s' if len(runs[(s, t)]) != 1 else ''})"
                     for s, t in keys]
    for p, m in markers.items():
        (h,) = axes[0][0].plot([], [], color="#444444", linestyle="none", marker=m)
        legend_handles.append(h)
        legend_labels.append(f"dropout p = {p:g}")
    fig.legend(legend_handles, legend_labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
               frameon=False, fontsize=9)
    files = ", ".join(sorted({shown(path) for path, rs in series.values()
                              if gpu in {r.gpu for r in rs}}))
    fig.suptitle(f"{gpu}: the cost of dropout, each rung and peer against itself at p = 0 in the "
                 "same run (the median over the runs)\n(1 = free; below 1: slower by that "
                 f"factor); from {files}", fontsize=10)
    fig.tight_layout()
    save(fig, out_dir, f"{tag}_dropout", written)
    plt.close(fig)


def fig_variants(plt, rows, gpu, tag, out_dir, names, written, ceil):
    """Each rung's ladder of ideas at seq 4096 (flash shapes, forward, dense): one bar per
    variant in the order the sweep ran them (baseline first, the default last), TFLOP/s with the
    percentage of the rung's measured ceiling; one panel per (dtype, d, causal)."""
    ladders = defaultdict(list)  # rung -> [rows], the default's row last
    for r in rows:
        if not (r.plain and r.flash_shape and r.seq_q == TABLE_SEQ and r.direction == "fwd"):
            continue
        rung = r.step.split("/")[0]
        if r.peer or rung not in RUNG_CEILING:
            continue
        ladders[rung].append(r)
    for rung, rs in sorted(ladders.items()):
        if not any(r.variant for r in rs):
            continue  # only the default measured: no ladder to draw
        panels = sorted({(r.dtype, r.dim, r.causal) for r in rs if r.variant})
        names_in_order = []  # variants in the sweep's order, then the default ("full")
        for r in rs:
            v = r.step.split("/")[1] if r.variant else None
            if v and v not in names_in_order:
                names_in_order.append(v)
        path, side = path_and_side(names_in_order)
        ceiling = ceil.get(RUNG_CEILING[rung])
        color = RUNG_COLOR.get(rung, "#333")
        width = max(8.5, 1.0 + 0.72 * (len(path) + len(side) + 1))
        fig, axes = plt.subplots(len(panels), 1, figsize=(width, 2.6 + 2.1 * len(panels)),
                                 squeeze=False)
        for ax, (dtype, dim, causal) in zip(axes[:, 0], panels):
            at = {(r.step.split("/")[1] if r.variant else "(default)"): r.tflops
                  for r in rs if (r.dtype, r.dim, r.causal) == (dtype, dim, causal)}
            # The path left to right, ending at the default; the side variants apart, right of
            # a gap and a dashed rule, hatched and paler: they are not steps on the path.
            on_path = [c for c in path + ["(default)"] if c in at]
            beside = [c for c in side if c in at]
            xs = list(range(len(on_path))) + [len(on_path) + 0.6 + i for i in range(len(beside))]
            cols = on_path + beside
            bars = ax.bar(xs, [at[c] for c in cols], color=color)
            for b, c in zip(bars, cols):
                if c in beside:
                    b.set_facecolor("white")
                    b.set_edgecolor(color)
                    b.set_hatch("//")
                pct = f"\n{100 * at[c] / ceiling.value:.0f}%" if ceiling else ""
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{at[c]:.0f}{pct}",
                        ha="center", va="bottom", fontsize=7)
            top = max([ceiling.value * (1.2 if beside else 1.08) if ceiling else 0] +
                      [v * (1.35 if beside else 1.25) for v in at.values()])
            if beside:
                x_rule = len(on_path) - 0.2
                ax.axvline(x_rule, color="#888", linestyle="--", linewidth=0.8)
                ax.text(x_rule - 0.1, top * 0.99, "the path", ha="right", va="top",
                        fontsize=7, color="#555")
                ax.text(x_rule + 0.1, top * 0.99, "beside the path", ha="left", va="top",
                        fontsize=7, color="#555")
            ax.set_xticks(xs)
            # Slanted labels, anchored at their right end under the bar: long names never meet.
            ax.set_xticklabels(cols, fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
            ax.set_ylabel("TFLOP/s")
            ax.set_title(f"{dtype}, d = {dim}, {'causal' if causal else 'not causal'}",
                         fontsize=9)
            if ceiling:
                ax.axhline(ceiling.value, color="#888", linestyle=":", linewidth=1)
            ax.set_ylim(0, top)
        what = ("\nhatched, right of the dashed rule: variants beside the path (not steps on it)"
                if side else "")
        fig.suptitle(f"{label(rung, names)}: one idea at a time, seq {TABLE_SEQ}, forward "
                     f"({gpu}); % of the measured {RUNG_CEILING[rung]} ceiling{what}"
                     if ceiling else f"{label(rung, names)}: one idea at a time ({gpu}){what}",
                     fontsize=9)
        fig.tight_layout()
        save(fig, out_dir, f"{tag}_variants_{rung}", written)
        plt.close(fig)


def path_and_side(variants):
    """A rung's variants (in the sweep's order) split into its path and the variants beside it.
    The descriptors name a step on the path '+idea' (it adds one idea to the variant before it)
    after a first, the baseline ('row', 'baseline'); a rung that uses '+' names has its other
    variants beside the path (05's 'fa1', the other loop order; 06's ablations 'no-swizzle',
    'p-via-smem', ...). A rung without '+' names (07: each variant adds to the one before) is
    all path."""
    if not any(v.startswith("+") for v in variants[1:]):
        return list(variants), []
    path = [v for i, v in enumerate(variants) if i == 0 or v.startswith("+")]
    return path, [v for v in variants if v not in path]


def load_trace(path):
    """The rung-07 trace rows, as dicts with ints for warp, tile and the times."""
    try:
        return _load_trace(path)
    except csv.Error as e:
        raise PathError(f"--results {path}: not a CSV file ({e})") from None


def _load_trace(path):
    out = []
    reader = csv_reader(path, "--results")
    missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        print(f"figures: {path}: skipped, missing columns {', '.join(missing)}",
              file=sys.stderr)
        return []
    for line, d in enumerate(reader, start=2):
        try:
            t = {"variant": d["variant"].strip(), "role": d["role"].strip(),
                 "phase": d["phase"].strip(), "warp": int(d["warp"]),
                 "tile": int(d["tile"]) if (d["tile"] or "").strip() not in ("", "-") else None,
                 "t0": float(d["t0_ns"]), "t1": float(d["t1_ns"])}
        except (TypeError, ValueError, AttributeError) as e:
            print(f"figures: {path}:{line}: skipped ({e})", file=sys.stderr)
            continue
        if not (math.isfinite(t["t0"]) and math.isfinite(t["t1"]) and t["t0"] >= 0):
            print(f"figures: {path}:{line}: skipped (times not finite and >= 0)",
                  file=sys.stderr)
            continue
        if t["t1"] < t["t0"]:
            print(f"figures: {path}:{line}: skipped (t1 < t0)", file=sys.stderr)
            continue
        out.append(t)
    return out


def fig_timeline(plt, trace, gpu, tag, out_dir, written):
    """(f) one figure per traced variant: a row per warp, a bar per phase (coloured by phase,
    labelled with its K/V tile where there is room), instant events as ticks."""
    import matplotlib.patches as mpatches
    cmap = plt.get_cmap("tab10")
    phases = []  # in order of first appearance: the legend reads like one tile's pipeline
    for t in sorted(trace, key=lambda t: (t["t0"], t["t1"])):
        if t["phase"] not in phases:
            phases.append(t["phase"])
    color = {p: cmap(i % 10) for i, p in enumerate(phases)}
    for variant in sorted({t["variant"] for t in trace}):
        rows = [t for t in trace if t["variant"] == variant]
        warps = sorted({t["warp"] for t in rows})
        role = {w: max(sorted({t["role"] for t in rows if t["warp"] == w}),
                       key=lambda r: sum(t["role"] == r for t in rows if t["warp"] == w))
                for w in warps}
        t_max = max(max(t["t1"] for t in rows), 1.0) / 1e3  # µs
        fig, ax = plt.subplots(figsize=(11, 0.38 * len(warps) + 1.6))
        shown_phases = []
        for y, w in enumerate(warps):
            for t in (t for t in rows if t["warp"] == w):
                c = color[t["phase"]]
                x0, x1 = t["t0"] / 1e3, t["t1"] / 1e3
                if x1 > x0:
                    ax.broken_barh([(x0, x1 - x0)], (y - 0.38, 0.76), facecolors=c,
                                   edgecolors="none")
                    if t["tile"] is not None and (x1 - x0) > 0.025 * t_max:
                        ax.text((x0 + x1) / 2, y, str(t["tile"]), ha="center", va="center",
                                fontsize=6, color="white")
                else:
                    ax.plot([x0], [y], marker="|", markersize=11, markeredgewidth=1.4, color=c,
                            linestyle="none")
                if t["phase"] not in shown_phases:
                    shown_phases.append(t["phase"])
        ax.set_yticks(range(len(warps)))
        ax.set_yticklabels([f"warp {w} ({role[w]})" for w in warps], fontsize=8)
        ax.set_ylim(len(warps) - 0.5, -0.5)  # warp 0 on top
        ax.set_xlim(0, t_max * 1.01)
        ax.set_xlabel("time since the block's first stamp, µs")
        ax.grid(True, axis="x", alpha=0.3)
        instant = {p for p in shown_phases
                   if all(t["t1"] == t["t0"] for t in rows if t["phase"] == p)}
        legend = [p for p in phases if p in shown_phases]
        handles = [(plt.Line2D([], [], color=color[p], marker="|", linestyle="none",
                               markersize=10) if p in instant else
                    mpatches.Patch(color=color[p])) for p in legend]
        ax.legend(handles, legend, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False,
                  fontsize=8)
        ax.set_title(f"{gpu}: rung 07 timeline, variant {variant}\n"
                     f"{trace_kernel(variant, role)}\n(one thread block; bars are phases, "
                     "numbers K/V tiles, ticks instant events)", fontsize=10)
        fig.tight_layout()
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", variant)
        save(fig, out_dir, f"{tag}_timeline_{stem}", written)
        plt.close(fig)


NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4}


def trace_kernel(variant, role):
    """What a traced block shows, counted from the trace ({warp: role}): its producer warps and
    its consumer warpgroups (4 warps each). A variant named for a number of consumers
    ('three-consumers') whose trace has another number says so: at the traced shape the variant
    ran another kernel (rung 07's 'three-consumers' runs its two-consumer kernel at d = 128)."""
    producers = sorted(w for w, r in role.items() if r == "producer")
    consumers = sorted(w for w, r in role.items() if r == "consumer")
    groups = len({w // 4 for w in consumers})
    text = ("traced: " + (f"{len(producers)} producer warp{'s' if len(producers) != 1 else ''}"
                          if producers else "no producer warp") + f", {groups} consumer "
            f"warpgroup{'s' if groups != 1 else ''}" +
            (f" (warps {consumers[0]}–{consumers[-1]})" if consumers else ""))
    m = re.match(r"(one|two|three|four)-consumers?$", variant)
    if m and NUMBER_WORDS[m.group(1)] != groups:
        text += (f", not {NUMBER_WORDS[m.group(1)]}: at the traced shape this variant runs its "
                 f"{groups}-consumer kernel")
    return text


def note_figures(notes_dir, written):
    """The figures the notes embed (![...](figures/NAME.svg)): each is one this run writes, so
    the notes show the current figures as soon as this script has run. Returns the embeds that
    name a figure this run did not write (a renamed or dropped figure), printed as warnings."""
    made = {Path(w).name for w in written}
    stale = []
    for note in sorted(Path(notes_dir).glob("*.md")):
        try:
            text = pathargs.read_text(note, "notes")
        except PathError as e:  # a note that cannot be read is no figure's embed
            print(f"figures: warning: {e}", file=sys.stderr)
            continue
        for m in re.finditer(r"!\[[^\]]*\]\(figures/([^)\s]+)\)", text):
            if m.group(1) not in made:
                stale.append(f"{shown(note)} embeds figures/{m.group(1)}, which this run did not write")
    for s in stale:
        print(f"figures: {s}", file=sys.stderr)
    return stale


def use_system_python():
    """Debian's python3-matplotlib serves /usr/bin/python3, and another python3 may come first
    on PATH (pyenv, a venv): without matplotlib here, run again under the system one, once,
    before reading anything (so every message is printed once)."""
    if importlib.util.find_spec("matplotlib") is not None:
        return
    system = "/usr/bin/python3"
    if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
            and not os.environ.get("LADDER_FIGURES_REEXEC")):
        os.environ["LADDER_FIGURES_REEXEC"] = "1"
        os.execv(system, [system, str(Path(__file__).resolve())] + sys.argv[1:])


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit("figures: matplotlib is missing: apt-get install python3-matplotlib "
                 "(or pip install matplotlib)")
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.hashsalt": "attention-ladder", "font.size": 9,
                                "svg.fonttype": "none", "axes.spines.top": False,
                                "axes.spines.right": False})
    import matplotlib.pyplot as plt
    return plt


# ---------------------------------------------------------------------------------------------
# The README table


def fmt_tf(v):
    if v is None:
        return "—"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.3g}"


def fmt_ratio(a, b):
    return "—" if a is None or b is None or b <= 0 else f"{a / b:.2f}×"


def table_seq(rungs):
    """4096 when measured; otherwise the largest seq that the most rungs share."""
    seqs = {r.seq_q for r in rungs}
    if TABLE_SEQ in seqs:
        return TABLE_SEQ
    count = {s: len({r.step for r in rungs if r.seq_q == s}) for s in seqs}
    return max(seqs, key=lambda s: (count[s], s))


def results_table(rows, history, gpu_tag, csv_path, names, figures):
    flash = [r for r in rows if r.flash_shape]
    rungs = [r for r in flash if not r.peer and r.dtype in TABLE_PEER]
    if not rungs:
        return [f"`{csv_path}`: no rung measured at the flash-attention shapes "
                f"(B·N = {TOKENS}, H·d = {HIDDEN}).", ""]
    seq = table_seq(rungs)
    at = {r.key(): r for r in flash if r.seq_q == seq}

    def row(step, dtype, dim, causal, direction):
        return at.get((step, dtype, TOKENS // seq if TOKENS >= seq else 1, HIDDEN // dim,
                       HIDDEN // dim, seq, seq, dim, causal, direction, 0.0, 1.0))

    def paired(step, dtype, dim, causal, direction, peer):
        """(rung TFLOP/s, peer TFLOP/s): the rung's latest row whose peer was measured in the
        same run (the same run column), and that peer row; else the rung's latest row alone
        (a later run that measured the rung without its peer, e.g. a variant sweep, must not
        hide the last side-by-side pair)."""
        latest = row(step, dtype, dim, causal, direction)
        if latest is None:
            return None, None
        key = latest.key()
        pkey = (peer,) + key[1:]
        for r in reversed([h for h in history if h.key() == key]):
            same = [h for h in history if h.key() == pkey and h.run == r.run]
            if same:
                return r.tflops, same[-1].tflops
        return latest.tflops, None

    step_rows = [r for r in rows if not r.peer]
    peer_rows = [r for r in rows if r.peer]
    gpus = unique(r.gpu for r in rows)
    cuda = unique(r.cuda for r in step_rows)
    torch_cuda = unique(r.cuda for r in peer_rows)
    commits = unique(r.commit for r in step_rows)
    # Text from the CSV (GPU names, versions, commits, steps) is escaped for Markdown.
    out = [f"### {md_text(', '.join(gpus) or gpu_tag)}", ""]
    meta = [f"from [{md_code(csv_path)}]({md_target(csv_path)})"]
    if cuda:
        meta.append(f"CUDA {md_text(', '.join(cuda))}")
    if torch_cuda:
        meta.append(f"peers: PyTorch SDPA built with CUDA {md_text(', '.join(torch_cuda))}")
    if commits:
        meta.append(f"commit{'s' if len(commits) > 1 else ''} {md_text(', '.join(commits))}")
    out += [" · ".join(meta) + ".", ""]
    out += [f"TFLOP/s at seq {seq} (B = {max(1, TOKENS // seq)}, H·d = {HIDDEN}); "
            "a ratio is the rung's TFLOP/s over its peer's measured in the same run "
            "(one `tools/gpu_check.sh` call: the same `run` column), side by side. Rows from "
            "before run ids carry `run` = `commit:<hash>` and pair by commit (the latest peer "
            "row of that commit).", ""]
    out += ["| rung | dtype | d | causal | fwd | bwd | peer: fwd / bwd | fwd ratio | bwd ratio |",
            "|---|---|---|---|--:|--:|---|--:|--:|"]
    points = sorted({(r.step, r.dtype, r.dim, r.causal) for r in rungs if r.seq_q == seq},
                    key=lambda k: (k[0], ("fp32", "bf16", "fp16").index(k[1]), k[2], k[3]))
    for step, dtype, dim, causal in points:
        peer = TABLE_PEER_BY_STEP.get(step, TABLE_PEER[dtype])
        f, pf = paired(step, dtype, dim, causal, "fwd", peer)
        b, pb = paired(step, dtype, dim, causal, "bwd", peer)
        peer_cell = f"{peer} {dtype}: {fmt_tf(pf)} / {fmt_tf(pb)}" if pf or pb else "—"
        out.append(f"| {md_code(label(step, names))} | {dtype} | {dim} | "
                   f"{'yes' if causal else 'no'} | {fmt_tf(f)} | {fmt_tf(b)} | {peer_cell} | "
                   f"{fmt_ratio(f, pf)} | "
                   f"{fmt_ratio(b, pb)} |")
    absent = sorted({r.step for r in rungs} - {p[0] for p in points})
    if absent:
        why = (" (`ladder bench --preset flash` runs the CPU rungs up to seq 1024)"
               if set(absent) <= CPU_RUNGS else "")
        out += ["", f"Not measured at seq {seq}: "
                f"{', '.join(md_code(label(s, names)) for s in absent)}{why}."]
    if figures:
        # The roofline shows every GPU rung at once; the other figures are a click away.
        roof = [p for p in figures if p.stem.endswith("_roofline")]
        title = lambda p: (p.stem[len(gpu_tag) + 1:].replace("tflops_", "TFLOP/s ")
                           .replace("timeline_", "timeline "))
        out += ["", "Figures: " + " · ".join(f"[{md_text(title(p))}]({md_target(p.as_posix())})"
                                             for p in figures)]
        out += [""] + [f"![{md_text(p.stem)}]({md_target(p.as_posix())})" for p in roof]
    return out + [""]


def readme_with_table(text, body):
    """The README's text with the block between the results markers replaced by `body`."""
    block = BEGIN + "\n" + body.rstrip("\n") + "\n" + END
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        a, b = text.index(BEGIN), text.index(END) + len(END)
        return text[:a] + block + text[b:]
    # First run: a "## Results" section just before "## Notes" (or at the end).
    m = re.search(r"^## Results[ \t]*\n", text, flags=re.M)
    if m:
        return text[:m.end()] + "\n" + block + "\n" + text[m.end():]
    m = re.search(r"^## Notes\b", text, flags=re.M)
    section = "## Results\n\n" + block + "\n\n"
    if m:
        return text[:m.start()] + section + text[m.start():]
    return text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"


class Edits:
    """The new text of each Markdown file this run rewrites, by resolved path: a file edited
    twice (a --readme that is also a step README) gets both edits. Nothing is written here."""

    def __init__(self):
        self.old, self.new, self.arg = {}, {}, {}

    def text(self, path, arg):
        key = Path(path).resolve()
        if key not in self.new:
            self.old[key] = self.new[key] = pathargs.read_text(path, arg)
            self.arg[key] = (Path(path), arg)
        return self.new[key]

    def set(self, path, text):
        self.new[Path(path).resolve()] = text

    def changed(self):
        """[(path as given, argument, new text)] of the files whose text changed."""
        return [(self.arg[k][0], self.arg[k][1], self.new[k]) for k in self.new
                if self.new[k] != self.old[k]]


def check_paths(results, out_dir, readme, steps):
    """Refuses, before anything is read or written (pathargs: an empty path, a link, a FIFO, a
    device), a --results folder that is not there (a typo must not rewrite the README as "No
    results yet"), a --readme that is not an existing regular Markdown file, a --figures path
    that is not a folder and a --steps path that is not a folder. Returns them as Paths."""
    results = pathargs.input_dir(results, "--results")
    readme = pathargs.input_file(readme, "--readme")
    if readme.suffix.lower() not in (".md", ".markdown"):
        raise PathError(f"--readme {readme}: not a Markdown file (.md); the results table is "
                        "Markdown and is written into a README only")
    out_dir = pathargs.output_dir(out_dir, "--figures")
    if steps is not None:
        steps = pathargs.input_dir(steps, "--steps")
    return results, out_dir, readme, steps


def default_steps(readme):
    """The step READMEs that follow --readme: the repository's steps/ when --readme is the
    repository's README.md, else none."""
    return ROOT / "steps" if readme.resolve() == (ROOT / "README.md").resolve() else None


def results_files(results):
    """The results files of the folder: every *.csv but the ceilings and the traces. A link, a
    FIFO, a device or a folder named *.csv is refused (pathargs), not read or skipped."""
    files = []
    for p in sorted(results.glob("*.csv")):
        pathargs.input_file(p, "--results")
        if p.name != CEILINGS_FILE and not re.search(r"-trace-\d+$", p.stem):
            files.append(p)
    # h100 first: it is the GPU the targets are set for.
    files.sort(key=lambda p: (p.stem != "h100", p.stem))
    return files


# ---------------------------------------------------------------------------------------------
# The step READMEs' measured tables


STEP_BEGIN, STEP_END = "<!-- step-results:begin -->", "<!-- step-results:end -->"
# The ceiling a row's % is taken of: the FFMA rate for fp32; for 16 bit the instruction the rung
# is built on (mma.sync, or wgmma for rung 07, measured in bf16 only).
STEP_CEILING = {"fp32": "fp32_ffma", "bf16": "mma_sync_bf16", "fp16": "mma_sync_fp16"}
STEP_CEILING_BY_STEP = {"07": {"bf16": "wgmma_bf16", "fp16": "wgmma_bf16"}}


def step_results_block(number, readme_dir, data, all_ceilings):
    """The lines between a step README's markers: for each results file, the step's TFLOP/s at
    the flash-attention shapes (dense, no dropout) and their % of the measured ceiling, every
    variant measured at one seq (4096 when the default variant has it, else the seq with the most
    rows of it), each row with the commit it was measured at."""
    rel = lambda path: Path(os.path.relpath(Path(path).resolve(), readme_dir)).as_posix()
    out = []
    if number in CPU_RUNGS:  # one sentence, whatever the GPUs measured
        links = ", ".join(f"[{md_code(shown(path))}]({md_target(rel(path))})" for path, _ in data)
        return [f"No rows for this step in {links}: it runs on the CPU, and the committed timings "
                "are of the GPU rungs (`build/ladder bench` times it on your machine).", ""]
    for path, rows in data:
        mine = [r for r in rows if r.step.split("/")[0] == number and r.plain and r.flash_shape
                and r.tflops > 0]
        if not mine:
            out += [f"No rows for this step in [{md_code(shown(path))}]({md_target(rel(path))}).",
                    ""]
            continue
        # 4096 when the default variant was measured there, else the seq with the most rows.
        count = defaultdict(int)
        for r in mine:
            count[r.seq_q] += not r.variant
        seq = TABLE_SEQ if count[TABLE_SEQ] else max(count, key=lambda s: (count[s], s))
        at = [r for r in mine if r.seq_q == seq]
        ceil = ceilings_for(all_ceilings, rows)
        used = {}  # ceiling name -> Ceiling, for the sentence under the table

        def cell(r):
            if r is None:
                return "—"
            name = STEP_CEILING_BY_STEP.get(number, {}).get(r.dtype, STEP_CEILING.get(r.dtype))
            c = ceil.get(name)
            if c is None:
                return fmt_tf(r.tflops)
            used[name] = c
            return f"{fmt_tf(r.tflops)} ({100 * r.tflops / c.value:.0f} %)"

        # The default variant first, then the others in the order their newest rows were
        # written (the order of the sweep that measured them, the descriptor's).
        variants = []
        for r in at:
            v = r.step.split("/")[1] if r.variant else ""
            if v not in variants:
                variants.append(v)
        variants.sort(key=lambda v: v != "")
        gpu = ", ".join(unique(r.gpu for r in at)) or path.stem
        cuda = ", ".join(unique(r.cuda for r in at))
        out += [f"**{md_text(gpu)}**" + (f", CUDA {md_text(cuda)}" if cuda else "") +
                f": TFLOP/s at seq {seq} (B = {max(1, TOKENS // seq)}, H·d = {HIDDEN}), dense, "
                f"no dropout, from [{md_code(shown(path))}]({md_target(rel(path))}); in brackets, "
                "the % of the "
                "measured ceiling named below the table; — where no row was measured.", "",
                "| variant | dtype | d | causal | fwd | bwd | commit |",
                "|---|---|--:|---|--:|--:|---|"]
        points = sorted({(r.dtype, r.dim, r.causal) for r in at},
                        key=lambda k: (("fp32", "bf16", "fp16", "fp64").index(k[0])
                                       if k[0] in ("fp32", "bf16", "fp16", "fp64") else 9,
                                       k[1], k[2]))
        for v in variants:
            step = f"{number}/{v}" if v else number
            for dtype, dim, causal in points:
                by_dir = {r.direction: r for r in at if r.step == step and
                          (r.dtype, r.dim, r.causal) == (dtype, dim, causal)}
                if not by_dir:
                    continue
                commits = unique(r.commit for r in by_dir.values())
                out.append(f"| {md_text(v) or '(default)'} | {md_text(dtype)} | {dim} | "
                           f"{'yes' if causal else 'no'} | {cell(by_dir.get('fwd'))} | "
                           f"{cell(by_dir.get('bwd'))} | {md_text(', '.join(commits)) or '—'} |")
        if used:
            out += ["", "Ceilings (measured by `tools/ceilings.cu`, [`ceilings.csv`]"
                    f"({md_target(rel(Path(path).parent / CEILINGS_FILE))})): " + "; ".join(
                        f"{n} {c.value:g} {md_text(c.unit)} (commit {md_text(c.commit)})"
                        for n, c in sorted(used.items())) + "."]
        else:
            out += ["", "No ceiling measured for this GPU: no % shown."]
        out.append("")
    return out


def step_readme_edits(steps_dir, data, all_ceilings, edits):
    """Rewrites, in `edits`, the block between the step-results markers of every
    STEPS/NN_*/README.md that has them (a README without them is left alone)."""
    for readme in sorted(Path(steps_dir).glob("[0-9][0-9]_*/README.md")):
        number = readme.parent.name[:2]
        if pathargs.input_file(readme, "--steps", missing_ok=True) is None:
            continue
        text = edits.text(readme, "--steps")
        if not (STEP_BEGIN in text and STEP_END in text and
                text.index(STEP_BEGIN) < text.index(STEP_END)):
            continue
        body = step_results_block(number, readme.parent, data, all_ceilings) if data else [
            "No results yet: `python3 tools/figures.py` writes this table from "
            "`notes/results/<gpu>.csv`."]
        a, b = text.index(STEP_BEGIN), text.index(STEP_END) + len(STEP_END)
        edits.set(readme, text[:a] + STEP_BEGIN + "\n" + "\n".join(body).rstrip("\n") + "\n" +
                  STEP_END + text[b:])


NO_RESULTS = ("No results yet. On a machine with an NVIDIA GPU, `tools/gpu_check.sh bench peers` "
              "measures the rungs and PyTorch's SDPA peers side by side into one CSV; saved as "
              "`notes/results/<gpu>.csv`, `python3 tools/figures.py` draws the figures and this "
              "table from it.")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "notes" / "results"),
                    help="folder of results CSV files (default notes/results)")
    ap.add_argument("--figures", default=str(ROOT / "notes" / "figures"),
                    help="output folder (default notes/figures)")
    ap.add_argument("--readme", default=str(ROOT / "README.md"),
                    help="the README whose results table is regenerated (default README.md)")
    ap.add_argument("--steps", metavar="DIR",
                    help="the folder whose NN_*/README.md measured tables are regenerated "
                    "(default: the repository's steps/ when --readme is the repository's "
                    "README.md, else none: a --readme elsewhere never rewrites steps/)")
    args = ap.parse_args(argv)
    results, out_dir, readme, steps = check_paths(args.results, args.figures, args.readme,
                                                  args.steps)
    if steps is None and args.steps is None:
        steps = default_steps(readme)
    files = results_files(results)
    if files:
        use_system_python()
    data = [(p, load(p)) for p in files]
    data = [(p, rows) for p, rows in data if rows]
    all_ceilings = load_ceilings(results / CEILINGS_FILE)
    if files and not data:  # files there, none usable: an error, not "no results yet"
        raise PathError(f"no usable row in {', '.join(shown(p) for p in files)} (see above); "
                        f"{readme.name} and the figures were left as they are")

    # Every output is made first, in memory; only then is anything written (all or nothing).
    edits = Edits()
    if steps is not None:
        step_readme_edits(steps, data, all_ceilings, edits)
    figures = []
    if not data:
        edits.set(readme, readme_with_table(edits.text(readme, "--readme"), NO_RESULTS))
        note = f"no results in {results}: {readme.name} says so"
    else:
        plt = import_pyplot()
        names = rung_names()
        drop = dropout_series(results)
        body = []
        for path, rows in data:
            tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem)
            gpu = ", ".join(unique(r.gpu for r in rows)) or tag
            history = load(path, latest=False)
            plain = [r for r in rows if r.plain and not r.variant]
            ceil = ceilings_for(all_ceilings, rows)
            if not ceil:
                print(f"figures: no ceilings for {gpu} in {shown(results / CEILINGS_FILE)}: "
                      "the figures draw no ceiling line")
            written = []
            fig_tflops(plt, plain, gpu, tag, out_dir, names, written, ceil)
            fig_roofline(plt, plain, gpu, tag, out_dir, names, written, ceil)
            for rung in roofline_highlights(ROOT / "notes", tag):
                fig_roofline(plt, plain, gpu, tag, out_dir, names, written, ceil, highlight=rung)
            fig_workspace(plt, plain, gpu, tag, out_dir, names, written)
            fig_sparsity(plt, rows, gpu, tag, out_dir, names, written)
            for g in unique(r.gpu for r in rows):
                fig_dropout(plt, drop, g, tag, out_dir, names, written)
            fig_variants(plt, rows, gpu, tag, out_dir, names, written, ceil)
            trace_path = results / f"{path.stem}-trace-07.csv"
            if pathargs.input_file(trace_path, "--results", missing_ok=True) is not None:
                trace = load_trace(trace_path)
                if trace:
                    fig_timeline(plt, trace, gpu, tag, out_dir, written)
            figures += written
            # The notes' highlighted rooflines are theirs: the README lists the others.
            svgs = [w.path for w in written if w.suffix == ".svg" and
                    not re.search(r"_roofline_\d\d$", w.stem)]
            try:
                csv_rel = path.resolve().relative_to(readme.resolve().parent).as_posix()
                svg_rel = [w.resolve().relative_to(readme.resolve().parent) for w in svgs]
            except ValueError:  # outside the README's tree (development runs): absolute paths
                csv_rel, svg_rel = str(path), svgs
            body += results_table(plain, [h for h in history if h.plain and not h.variant], tag,
                                  csv_rel, names, svg_rel)
        if out_dir.resolve() == (ROOT / "notes" / "figures").resolve():
            note_figures(ROOT / "notes", figures)
        edits.set(readme, readme_with_table(edits.text(readme, "--readme"), "\n".join(body)))
        note = None

    changed = edits.changed()
    created = pathargs.missing_folders(out_dir) if figures else []
    with pathargs.Staged() as out:
        try:
            if created:
                out_dir.mkdir(parents=True, exist_ok=True)
            for f in figures:
                out.add(f.path, f.data, "--figures")
            for path, arg, text in changed:
                out.add(path, text, arg)
            out.publish()
        except BaseException:
            out.discard()
            for folder in reversed(created):  # only the folders this run made, if still empty
                try:
                    folder.rmdir()
                except OSError:
                    break
            raise
    for f in figures:
        print(f"figures: wrote {shown(f.path)}")
    readme_changed = readme.resolve() in {Path(p).resolve() for p, _, _ in changed}
    for path, arg, _ in changed:
        if arg == "--steps":
            print(f"figures: {shown(path)} measured table updated")
    if note:
        print(f"figures: {note}{'' if readme_changed else ' (unchanged)'}; no figures written")
    else:
        print(f"figures: {readme.name} results table "
              f"{'updated' if readme_changed else 'unchanged'}")
    return 0


def main_or_exit(argv=None):
    """main(), with a path the rule refuses or a file that cannot be read or written said
    plainly (exit 2), not a traceback; every output is then as it was."""
    try:
        return main(argv)
    except PathError as e:
        print(f"figures: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"figures: error: {e.strerror or e}" + (f": {e.filename}" if e.filename else "") +
              "; nothing was written", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("figures: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main_or_exit())
