#!/usr/bin/env python3
"""tools.stalls: tools/stalls.py ranks an ncu source page's stall samples.

  check_stalls.py SOURCE_DIR

A made-up source page in ncu's CSV shape: a prologue run 10 times, a loop of 10 instructions run
1000 times each and a spin loop of 2 run 4000 times each. The loop accounts for the most executed
instructions (10 000 against the spin loop's 8000), so the dominant count is 1000 and the hot set
is the loop and the spin loop, not the prologue. One STS takes 4 wavefronts per execution against
an ideal 2 and must be the only conflict listed; the HGMMA's samples have no reason column and
must show as "no column". Out-of-range --hot and a page without its header row are refused.
"""
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

TOOL = Path(sys.argv[1]) / "tools" / "stalls.py"
HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)",
        "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
        "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal", "stall_long_sb", "stall_mio",
        "stall_barrier", "stall_selected", "stall_mio (Not Issued)"]


def ins(addr, src, samples, execs, waves=0, ideal=0, long_sb=0, mio=0, barrier=0, selected=0):
    return [hex(addr), f"      {src}", samples, samples, execs, waves, ideal, long_sb, mio,
            barrier, selected, 0]


def page():
    rows = [ins(0, "LDC R1, c[0x0][0x28]", 50, 10, long_sb=50)]  # prologue: cold
    loop = [("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ", 700, 0, 0),  # 700, no column
            ("STS.64 [R16], R152", 400, 4000, 2000),                     # the conflict
            ("STS.64 [R16+0x400], R154", 30, 2000, 2000),                # at its ideal
            ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", 300, 0, 0)]
    for k in range(10):
        src, s, w, i = loop[k] if k < len(loop) else (f"FFMA R{k}, R{k}, R{k}, R{k}", 5, 0, 0)
        kw = {"mio": s} if src.startswith("STS") else {"barrier": s} if "BAR" in src else \
            {"selected": s} if src.startswith("FFMA") else {}
        rows.append(ins(0x10 * (k + 1), src, s, 1000, w, i, **kw))
    rows.append(ins(0x200, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2+URZ+0x40], R9", 0, 4000))
    rows.append(ins(0x210, "@!P0  BRA 0x7f00", 90, 4000, long_sb=90))
    return rows


def run(rows, *args, header=True):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.sass.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["Kernel Name", "void k()"])
            if header:
                w.writerow(HEAD)
            w.writerows(rows)
        r = subprocess.run([sys.executable, str(TOOL), str(path), *args], capture_output=True,
                           text=True)
    return r.returncode, r.stdout + r.stderr


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    rc, out = run(page(), "--top", "3")
    check(rc == 0, f"exit {rc} on a good page:\n{out}")
    check(out.startswith("12 of 13 instructions executed >= 0.9 x 1000: 1550 of 1600 samples"),
          f"hot set: the loop and the spin loop, not the prologue:\n{out}")
    check("no column                 700" in out, f"HGMMA's samples without a column:\n{out}")
    conflicts = out.split("above their ideal wavefronts")[1].split("\n\n")[0]
    check("STS.64 [R16], R152" in conflicts and "4.0 /  2.0" in conflicts,
          f"the conflicting STS is listed with 4 / 2 wavefronts:\n{conflicts}")
    check("R154" not in conflicts, f"the STS at its ideal is not listed:\n{conflicts}")
    top = [line for line in out.split("in program order")[1].splitlines()[1:] if line.strip()]
    check([line.split()[0] for line in top] == ["1", "2", "4"],
          f"the 3 with the most samples (HGMMA 700, STS 400, BAR 300) in program order:\n{out}")
    check("mio 400" in top[1], f"the STS's reason:\n{top[1]}")

    rc, out = run(page(), "--hot", "0")
    check(rc == 0 and out.startswith("13 of 13"), f"--hot 0 keeps every instruction:\n{out}")
    rc, out = run(page(), "--hot", "2")
    check(rc == 2 and "--hot is a fraction" in out, f"--hot 2 is refused:\n{out}")
    rc, out = run(page(), header=False)
    check(rc != 0 and "no 'Address' header" in out, f"a page without its header:\n{out}")

    for f in failures:
        print("FAIL:", f)
    print(f"tools.stalls: {'FAILED' if failures else 'passed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
