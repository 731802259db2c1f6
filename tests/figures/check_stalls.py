#!/usr/bin/env python3
"""tools.stalls: tools/stalls.py ranks an ncu source page's stall samples.

  check_stalls.py SOURCE_DIR

A made-up source page in ncu's CSV shape: a prologue run 10 times, a loop of 10 instructions run
1000 times each and a spin loop of 2 run 4000 times each. The loop accounts for the most executed
instructions (10 000 against the spin loop's 8000), so the dominant count is 1000 and the hot set
is the loop and the spin loop, not the prologue. One STS takes 4 wavefronts per execution against
an ideal 2 and must be the only conflict listed; the HGMMA's samples have no reason column and
must show as "no column" (the "(Not Issued)" columns, which repeat the reasons, must not count).
The listing is in program order, not by samples, with the cumulative share; --phases splits the
hot samples at its rows (the rows before the first go to the last phase); the cold rows are
summed by execution count; a gzipped page reads the same. Out-of-range --hot and --top, a bad
--phases, a missing file and a page without its header row are refused with one line.
"""
import csv
import gzip
import subprocess
import sys
import tempfile
from pathlib import Path

TOOL = Path(sys.argv[1]) / "tools" / "stalls.py"
HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)",
        "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed",
        "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal", "stall_long_sb", "stall_mio",
        "stall_barrier", "stall_selected", "stall_mio (Not Issued)", "stall_barrier (Not Issued)"]


def ins(addr, src, samples, execs, waves=0, ideal=0, long_sb=0, mio=0, barrier=0, selected=0):
    return [hex(addr), f"      {src}", samples, samples, execs, waves, ideal, long_sb, mio,
            barrier, selected, mio, barrier]  # Not Issued: a subset of the same samples


def page():
    rows = [ins(0, "LDC R1, c[0x0][0x28]", 50, 10, long_sb=50)]  # prologue: cold
    loop = [("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ", 700, 0, 0),  # 700, no column
            ("STS.64 [R16], R152", 400, 4000, 2000),                     # the conflict
            ("STS.64 [R16+0x400], R154", 30, 2000, 2000),                # at its ideal
            ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", 800, 0, 0)]
    for k in range(10):
        src, s, w, i = loop[k] if k < len(loop) else (f"FFMA R{k}, R{k}, R{k}, R{k}", 5, 0, 0)
        kw = {"mio": s} if src.startswith("STS") else {"barrier": s} if "BAR" in src else \
            {"selected": s} if src.startswith("FFMA") else {}
        rows.append(ins(0x10 * (k + 1), src, s, 1000, w, i, **kw))
    rows.append(ins(0x200, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2+URZ+0x40], R9", 0, 4000))
    rows.append(ins(0x210, "@!P0  BRA 0x7f00", 90, 4000, long_sb=90))
    return rows


def run(rows, *args, header=True, gz=False, path=None):
    with tempfile.TemporaryDirectory() as tmp:
        path = path or Path(tmp) / ("k.sass.csv.gz" if gz else "k.sass.csv")
        opener = gzip.open if gz else open
        with opener(path, "wt", newline="") as f:
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
    # Hot: 700 + 400 + 30 + 800 + 6 x 5 (the loop) + 90 (the spin loop) = 2050 of 2100.
    check(out.startswith("12 of 13 instructions executed >= 0.9 x 1000: 2050 of 2100 samples"),
          f"hot set: the loop and the spin loop, not the prologue:\n{out}")
    check("no column                 700" in out, f"HGMMA's samples without a column:\n{out}")
    check("  mio                       430" in out and "  barrier                   800" in out,
          f"the reasons, the Not Issued columns left out:\n{out}")
    kinds = out.split("by instruction kind")[1].split("\n\n")[0]
    for k, v in (("BAR", 800), ("HGMMA", 700), ("STS", 430), ("other", 120)):
        check(f"  {k:20s}{v:9d}" in kinds, f"kind {k} = {v}:\n{kinds}")
    conflicts = out.split("above their ideal wavefronts")[1].split("\n\n")[0]
    check("STS.64 [R16], R152" in conflicts and "4.0 /  2.0" in conflicts,
          f"the conflicting STS is listed with 4 / 2 wavefronts:\n{conflicts}")
    check("R154" not in conflicts, f"the STS at its ideal is not listed:\n{conflicts}")
    top = [line.split() for line in
           out.split("in program order")[1].split("\n\n")[0].splitlines()[1:] if line.strip()]
    check([t[0] for t in top] == ["1", "2", "4"],
          f"the 3 with the most samples (BAR 800, HGMMA 700, STS 400) in program order:\n{out}")
    check([t[2] for t in top] == ["34.1", "53.7", "94.1"],
          f"cumulative shares 700, 1100 and 1930 (rows 3 and 4: + 30 + 800) of 2050:\n{out}")
    check("mio 400" in " ".join(top[1]), f"the STS's reason:\n{top}")
    cold = out.split("by execution count")[1]
    check("10 x        50" in cold, f"the prologue's samples by its count:\n{cold}")

    rc, out = run(page(), "--phases", "2=stage,4=barrier")
    ph = out.split("samples by phase")[1] if "samples by phase" in out else out
    # Phase "stage": rows 2-3 (400 + 30); "barrier": rows 4.. (800 + 6 x 5 + 90) and the wrap (700).
    check(rc == 0 and "    2       430  21.0 %  stage" in ph and "    4      1620  79.0 %  barrier" in ph,
          f"--phases:\n{out}")
    for bad in ("4,2", "0", "x"):
        rc, out = run(page(), "--phases", bad)
        check(rc == 2 and "--phases" in out, f"--phases {bad} is refused:\n{out}")

    rc, gz_out = run(page(), "--top", "3", gz=True)
    rc2, out = run(page(), "--top", "3")
    check(rc == 0 and gz_out == out, "a gzipped page reads the same")
    rc, out = run(page(), "--hot", "0")
    check(rc == 0 and out.startswith("13 of 13"), f"--hot 0 keeps every instruction:\n{out}")
    for flag, value, msg in (("--hot", "2", "--hot is a fraction"), ("--top", "-1", "--top is a")):
        rc, out = run(page(), flag, value)
        check(rc == 2 and msg in out, f"{flag} {value} is refused:\n{out}")
    rc, out = run(page(), header=False)
    check(rc != 0 and "no 'Address' header" in out, f"a page without its header:\n{out}")
    r = subprocess.run([sys.executable, str(TOOL), "/nonexistent/k.sass.csv"], capture_output=True,
                       text=True)
    check(r.returncode != 0 and "cannot read" in r.stderr and "Traceback" not in r.stderr,
          f"a missing file, one line:\n{r.stderr}")

    for f in failures:
        print("FAIL:", f)
    print(f"tools.stalls: {'FAILED' if failures else 'passed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
