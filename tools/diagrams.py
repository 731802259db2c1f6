#!/usr/bin/env python3
"""The notes' concept diagrams, drawn from the code's own constants so that they stay true.

A note holds a diagram between two marker lines:

    <!-- diagram:NAME -->
    ```text
    ...
    ```
    <!-- /diagram -->

This script draws every diagram it knows (DIAGRAMS below: one small function each) from the
constants it reads out of steps/ (tile sizes, threads per block, head dims) and writes the
block between the markers. A marker whose NAME it does not know, or a diagram no note holds, is
an error.

  tools/diagrams.py [ROOT]            rewrite every diagram block that changed
  tools/diagrams.py [ROOT] --check    exit 1, naming each stale block, if any would change

Exit status: 0 ok, 1 stale (--check) or a marker problem, 2 a constant not found in the source.
Standard library only.
"""
import math
import re
import sys
from pathlib import Path

BLOCK = re.compile(r"(<!-- diagram:([\w.-]+) -->\n)(.*?)(<!-- /diagram -->)", re.S)


class SourceError(Exception):
    pass


def grep(root, path, pattern):
    """The groups of the first match of pattern in root/path (the constant a diagram needs)."""
    try:
        text = (root / path).read_text()
    except OSError as e:
        raise SourceError(f"{path}: cannot read it ({e.strerror}): the diagram's source moved")
    m = re.search(pattern, text)
    if not m:
        raise SourceError(f"{path}: no match for {pattern!r}: the diagram's constant moved")
    return m.groups()


# ---- constants, read from the source ------------------------------------------------------

def step02_tile(root):
    """Step 02's default Br = Bc (choose_tiles: 64 or the sequence when shorter)."""
    return int(grep(root, "steps/02_online_softmax/online_softmax.cpp",
                    r"if \(asked == 0\) return int\(std::min<int64_t>\((\d+), seq\)\)")[0])


def threads(root, path):
    return int(grep(root, path, r"constexpr int kThreads = (\d+);")[0])


def step04_dims(root):
    dims = grep(root, "steps/04_thread_per_row/thread_per_row.cu", r"using HeadDims = Dims<([\d, ]+)>")[0]
    return [int(x) for x in dims.split(",")]


def step06_tiles(root, d):
    """(Br, Bc) of step 06's forward at head dim d (FwdTiles in params.cuh)."""
    path = "steps/06_tensor_core_fa2/params.cuh"
    w256, w, s256, s = map(int, grep(root, path, r"kWarps = D == 256 \? (\d+) : (\d+), "
                                                 r"kSlices = D == 256 \? (\d+) : (\d+);"))
    bc_le, bc_small, bc_big = map(int, grep(root, path, r"kBc = D <= (\d+) \? (\d+) : (\d+);"))
    warps, slices = (w256, s256) if d == 256 else (w, s)
    return warps * 16 * slices, (bc_small if d <= bc_le else bc_big)


# ---- the diagrams ---------------------------------------------------------------------------

def online_tiles(root):
    """Note 02: S cut into Br x Bc tiles, one query tile's m, l, O carried along its row."""
    t = step02_tile(root)
    n = 4 * t
    cell = "+----------" * 4 + "+"
    rows = [f"S = scale * Q K^T, M = N = {n}, in Br x Bc = {t} x {t} tiles (step 02's default):"
            f" Tr = Tc = {n // t}", "",
            "            K_1,V_1    K_2,V_2    K_3,V_3    K_4,V_4     (Bc = %d keys each)" % t,
            "           " + cell]
    for i in range(1, 5):
        if i == 2:
            rows.append(f"  Q_{i}      |   S_21 ----> S_22 ----> S_23 ----> S_24   |"
                        "  =>  O_2 = O~ / l,  LSE_2 = m + log l")
        else:
            rows.append(f"  Q_{i}      |" + "|".join(f"   S_{i}{j}   " for j in range(1, 5)) + "|")
        rows.append("           " + cell)
    rows += ["",
             f"Query tile Q_2 ({t} rows) keeps m ({t}), l ({t}) and O~ ({t} x d) while it walks its",
             "row of tiles left to right; nothing of S_2j outlives its step. At tile j, per row:",
             "",
             "    m_new = max(m, rowmax S_2j)      alpha = exp(m - m_new)   (<= 1; 0 on the first tile)",
             "    P~    = exp(S_2j - m_new)        entries in [0, 1]",
             "    l     = alpha * l  + rowsum P~",
             "    O~    = alpha * O~ + P~ V_j",
             "    m     = m_new",
             ""] + online_trace()
    return rows


def online_trace():
    """One row through four tiles of two keys: the rescale at work, checked against softmax."""
    s = [(0.0, 1.0), (3.0, 0.0), (2.0, 2.0), (-1.0, 5.0)]
    v = [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0)]
    rows = ["One row, four tiles of two keys; d = 1 and each key's value is its number, 1..8:", "",
            "    tile  scores    m_new  alpha    l        O~       O~ / l"]
    m, l, o = -math.inf, 0.0, 0.0
    for j, (sj, vj) in enumerate(zip(s, v), 1):
        m_new = max(m, *sj)
        alpha = math.exp(m - m_new)
        p = [math.exp(x - m_new) for x in sj]
        l = alpha * l + sum(p)
        o = alpha * o + sum(pi * vi for pi, vi in zip(p, vj))
        m = m_new
        rows.append(f"    {j}     ({sj[0]:2.0f},{sj[1]:2.0f})   {m_new:5.0f}  {alpha:6.4f}  "
                    f"{l:7.4f}  {o:7.4f}  {o / l:6.4f}")
    flat_s = [x for sj in s for x in sj]
    flat_v = [x for vj in v for x in vj]
    z = sum(math.exp(x) for x in flat_s)
    exact = sum(math.exp(x) / z * y for x, y in zip(flat_s, flat_v))
    rows += ["", f"    softmax(all 8 scores) . V = {exact:.4f}: the last O~ / l, with no pass over"
             " the scores again"]
    return rows


def naive_round_trips(root):
    """Note 03: what the unfused forward writes to memory, at the note's benchmark shape."""
    nthreads = threads(root, "steps/03_naive_cuda/naive_cuda.cu")
    b, h, m, n, d = 8, 32, 2048, 2048, 64  # the note's benchmark shape
    gib = lambda floats: f"{floats * 4 / 2**30:g} GiB"
    mib = lambda floats: f"{floats * 4 / 2**20:g} MiB"
    smn, qd = b * h * m * n, b * h * m * d
    unfused = 4 * b * h * (2 * m * d + 2 * n * d + 4 * m * n)
    fused = 4 * b * h * (2 * m * d + 2 * n * d)
    return [f"Step 03's forward: three launches ({nthreads} threads a block), each a round trip"
            " through HBM.",
            f"B = {b}, H = {h}, M = N = {m}, d = {d} (the benchmark shape):",
            f"Q, K, V, O are {mib(qd)} each, S and P {gib(smn)} each.",
            "",
            "   HBM                      kernel                                    HBM",
            "   Q, K  --read-->  [1] batched_matmul   S = scale * Q K^T   --write-->  S    (B*H*M*N)",
            "   S     --read-->  [2] softmax_rows     P = softmax(S), LSE --write-->  P    (B*H*M*N)",
            "   P, V  --read-->  [3] batched_matmul   O = P V             --write-->  O    (B*H*M*d)",
            "",
            f"   S and P each cross HBM twice (written, read back): 4 x {gib(smn)} of the",
            f"   {unfused / 1e9:.1f} GB the forward moves. Fused (steps 04-07), S and P stay on chip and",
            f"   only Q, K, V and O cross: {fused / 1e9:.2f} GB, {unfused / fused:.0f}x less.",
            "   The naive backward adds dP and dS, two more B*H*M*N buffers, and reads P again."]


def thread_per_row(root):
    """Note 04: one thread per query row, walking every visible key with its state in registers."""
    nthreads = threads(root, "steps/04_thread_per_row/thread_per_row.cu")
    dims = step04_dims(root)
    regs = ", ".join(f"{2 * d + 2} at d = {d}" for d in dims)
    return [f"grid (ceil(M/{nthreads}), H, B); a block = {nthreads} threads = {nthreads} consecutive"
            " query rows of one (b, h)",
            "",
            "  warp 0   threads  0..31  -> rows i0    .. i0+31   \\  at step j all 32 lanes of a",
            "  warp 1   threads 32..63  -> rows i0+32 .. i0+63    >  warp load the same K_j, V_j:",
            f"  ...      ({nthreads // 32} warps)                              /  one broadcast; no reuse",
            "                                                       across warps",
            "",
            f"  thread t (query row i = {nthreads} * blockIdx.x + t) holds, in registers:",
            "      q[0..d)   o[0..d)   m   l                    2d + 2 floats",
            "",
            "      K_0   K_1   K_2   ...   K_j   ...   K_{n-1}   (n = keys row i may see)",
            "       |     |     |           |",
            "       v     v     v           v     one key per iteration, read from L1/L2:",
            "      s  = scale * (q . K_j)                      d dependent FFMAs",
            "      m' = max(m, s)   a = exp(m - m')   p = exp(s - m')",
            "      l  = a*l + p     o = a*o + p*V_j   m = m'   2d more instructions",
            "",
            "      after the last key:  O_i = o / l,  LSE_i = m + log l   (one store per row)",
            "",
            "  floats of state per thread, by head dim:",
            f"      {regs}",
            "  (a thread has at most 255 registers: at d = 256, q and o go to local memory)"]


def causal_tiles(root):
    """Note 06: the three classes of tile under the causal mask, at step 06's own tile sizes."""
    rows = []
    for d in (64, 128):
        br, bc = step06_tiles(root, d)
        m = n = 1024
        grid, counts = causal_grid(m, n, br, bc)
        full, diagonal, hidden = counts["#"], counts["\\"], counts["."]
        rows += [f"d = {d}: Br x Bc = {br} x {bc}, M = N = {m}",
                 f"        {full} tiles with no mask, {diagonal} masked, {hidden} never loaded"]
        rows += ["    " + g for g in grid] + [""]
    return rows + ["  # every key visible to every row: no mask at all",
                   "  \\ straddles the diagonal: the element mask, key j visible iff j <= i + N - M",
                   "  . hidden from the tile's last row: skipped, never loaded",
                   "Each row of characters is one query tile (one block), left to right its key tiles."]


def causal_grid(m, n, br, bc):
    grid, counts = [], {"#": 0, "\\": 0, ".": 0}
    for i0 in range(0, m, br):
        first_row_last_key = i0 + n - m  # the last key the tile's first row sees
        last_row_last_key = min(i0 + br, m) - 1 + n - m
        line = ""
        for j0 in range(0, n, bc):
            j1 = min(j0 + bc, n) - 1
            c = "." if j0 > last_row_last_key else "#" if j1 <= first_row_last_key else "\\"
            counts[c] += 1
            line += c
        grid.append(line)
    return grid, counts


def causal_mask(root):
    """Note 00: the bottom-right causal mask, key j visible to query i iff j <= i + N - M."""
    shapes = [(5, 5, "square"), (3, 6, "a cache"), (6, 3, "M > N")]
    grids = [causal_rows(m, n) for m, n, _ in shapes]
    width = [max(len(r) for r in g) for g in grids]
    rows = ["   ".join(f"{label}: M = {m}, N = {n}".ljust(w) for (m, n, label), w in
                       zip(shapes, width)).rstrip(), ""]
    for k in range(max(len(g) for g in grids)):
        rows.append("   ".join((g[k] if k < len(g) else "").ljust(w)
                               for g, w in zip(grids, width)).rstrip())
    return rows + ["", "  x visible, . hidden; a row is a query i, a column a key j. The last query always",
                   "  sees every key; when M > N the first M - N rows see none (O = 0, LSE = -inf)."]


def causal_rows(m, n):
    header = "      " + " ".join(f"{j}" for j in range(n))
    rows = [header]
    for i in range(m):
        visible = min(n, max(0, i + n - m + 1))
        cells = " ".join("x" if j < visible else "." for j in range(n))
        rows.append(f"  i={i} {cells}  n={visible}")
    return rows


def three_passes(root):
    """Note 01: one row of S, written once and read three times, each pass waiting on the last."""
    s = [1.0, 3.0, 2.0, -1.0]
    v = [1.0, 2.0, 3.0, 4.0]
    m = max(s)
    e = [math.exp(x - m) for x in s]
    l = sum(e)
    p = [x / l for x in e]
    o = sum(pi * vi for pi, vi in zip(p, v))
    fmt = lambda xs, f: "  ".join(f.format(x) for x in xs)
    return ["one query row, N = 4 visible keys, d = 1 (V_j = j + 1):", "",
            f"  scores  write the row:  S_ij = tau q_i . K_j  [ {fmt(s, '{:6.3f}')} ]",
            f"  pass 1  read the row:   m = max_j S_ij        = {m:.3f}",
            f"  pass 2  read the row:   e^(S_ij - m)          [ {fmt(e, '{:6.4f}')} ]",
            f"                          l = sum of those      = {l:.4f}   (needs the final m)",
            f"  pass 3  read the row:   P_ij = e^(S_ij - m)/l [ {fmt(p, '{:6.4f}')} ]",
            f"                          O_i = sum P_ij V_j    = {o:.4f}   (needs the final l)",
            f"                          LSE_i = m + log l     = {m + math.log(l):.4f}",
            "",
            "  Three reads of the row because each pass needs the previous pass's final value;",
            "  step 02's online recurrence folds passes 1 and 2 (and then 3) into one."]


DIAGRAMS = {
    "causal-mask": causal_mask,
    "three-passes": three_passes,
    "online-tiles": online_tiles,
    "naive-round-trips": naive_round_trips,
    "thread-per-row": thread_per_row,
    "causal-tiles": causal_tiles,
}


def render(name, root):
    return "```text\n" + "\n".join(line.rstrip() for line in DIAGRAMS[name](root)) + "\n```\n"


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    flags = [a for a in argv if a.startswith("--")]
    if any(f != "--check" for f in flags) or len(args) > 1:
        print("usage: tools/diagrams.py [ROOT] [--check]", file=sys.stderr)
        return 2
    root = Path(args[0]).resolve() if args else Path(__file__).resolve().parent.parent
    check = "--check" in flags
    problems, seen = [], set()
    try:
        for note in sorted((root / "notes").glob("*.md")):
            text = note.read_text()

            def fill(m):
                name = m.group(2)
                if name not in DIAGRAMS:
                    problems.append(f"{note.relative_to(root)}: unknown diagram {name!r}")
                    return m.group(0)
                seen.add(name)
                body = render(name, root)
                if body != m.group(3):
                    problems.append(f"{note.relative_to(root)}: diagram {name} is stale"
                                    + ("" if check else " (rewritten)"))
                return m.group(1) + body + m.group(4)

            new = BLOCK.sub(fill, text)
            if new != text and not check:
                note.write_text(new)
    except SourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems += [f"no note holds diagram {name}" for name in DIAGRAMS if name not in seen]
    for p in problems:
        print(p)
    stale = [p for p in problems if not p.endswith("(rewritten)")]
    if check and problems or stale:
        if check:
            print("run tools/diagrams.py to redraw them")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
