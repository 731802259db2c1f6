#!/usr/bin/env python3
"""exercise.padding: step 05's padded shared-memory rows are conflict-free by construction, and
its `padding` exercise region fails clearly while blank.

The harness checks results only, and a layout with bank conflicts is still correct (only
slower), so Layout in steps/05_shared_memory_fa2/shared_memory_fa2.cuh static_asserts that its
padded row strides are conflict-free (conflict_free simulates the warp's accesses). This test
compiles one small translation unit, which instantiates Layout padded and unpadded for every
head dim the step's capability table lists, against three copies of the step's headers:
  - the solution: compiles;
  - the learner's copy with the region blank (tools/exercise.py create 5 --region padding):
    fails, and the compiler's message names the region;
  - that copy with pads of 0: fails with each of the four bank-conflict static_asserts (K_j
    and Q_i reads, P_ij writes and reads), and only for padded layouts (the unpadded variants'
    Layout<D, false> is exempt by design).

  check_padding.py ROOT NVCC SCRATCH_DIR
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

STEP = "05_shared_memory_fa2"
HEADER = "shared_memory_fa2.cuh"
CONFLICTS = ["bank conflict reading K_j", "bank conflict reading Q_i",
             "bank conflict writing P_ij", "bank conflict reading P_ij"]


def compile_tu(nvcc, root, headers, dims, scratch):
    """Compiles a TU instantiating Layout<D> and Layout<D, false> for each D: (ok, output)."""
    tu = scratch / "layouts.cu"
    body = "".join(f"template struct Layout<{d}>;\ntemplate struct Layout<{d}, false>;\n"
                   for d in dims)
    tu.write_text(f'#include "{HEADER}"\nnamespace ladder::step05 {{\n{body}}}\n')
    cmd = [nvcc, "-std=c++17", "--expt-relaxed-constexpr", "-arch=sm_90", "-I", str(headers),
           "-I", str(root / "common"), "-x", "cu", "-c", str(tu), "-o", str(scratch / "layouts.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    root, nvcc, scratch = Path(sys.argv[1]).resolve(), sys.argv[2], Path(sys.argv[3]).resolve()
    step = root / "steps" / STEP
    caps = (step / "capabilities.hpp").read_text(encoding="utf-8")
    m = re.search(r"using\s+HeadDims\s*=\s*Dims<([\d,\s]+)>", caps)
    if not m:
        print(f"FAIL: no `using HeadDims = Dims<...>` in {step / 'capabilities.hpp'}")
        return 1
    dims = [int(x) for x in m.group(1).split(",")]
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    problems = []

    ok, out = compile_tu(nvcc, root, step, dims, scratch)
    if not ok:
        problems.append(f"the solution's Layout does not compile:\n{out}")

    ex = scratch / "ex"
    r = subprocess.run([sys.executable, str(root / "tools" / "exercise.py"), "create", "5",
                        "--dir", str(ex), "--region", "padding"], capture_output=True, text=True)
    copy = ex / STEP
    if r.returncode != 0 or not (copy / HEADER).is_file():
        print(f"FAIL: tools/exercise.py create 5 --region padding failed:\n{r.stdout}{r.stderr}")
        return 1
    text = (copy / HEADER).read_text(encoding="utf-8")
    blank = 'LADDER_TODO("padding");'
    if text.count(blank) != 1:
        problems.append(f"the blank copy has {text.count(blank)} {blank} lines, not 1")
    ok, out = compile_tu(nvcc, root, copy, dims, scratch)
    if ok:
        problems.append("the blank 'padding' region compiles: a learner's copy would not fail")
    elif "exercise region" not in out or "padding" not in out:
        problems.append(f"the blank region's compile error does not name the region:\n{out}")

    (copy / HEADER).write_text(text.replace(blank, "return {0, 0};"), encoding="utf-8")
    ok, out = compile_tu(nvcc, root, copy, dims, scratch)
    if ok:
        problems.append("pads of 0 compile: Layout's bank-conflict static_asserts never fire")
    # Each error with the Layout it was raised for: (message, D, kPad).
    fired = set()
    for block in re.split(r"\n(?=\S[^\n]*error)", out):
        inst = re.search(r"Layout<D, kPad> \[with D=(\d+), kPad=(\w+)\]", block)
        for msg in CONFLICTS:
            if msg in block.split("\n")[0]:
                fired.add((msg, int(inst.group(1)) if inst else 0, inst.group(2) if inst else ""))
    for msg in CONFLICTS:
        for d in dims:
            if (msg, d, "true") not in fired:
                problems.append(f"pads of 0: no static_assert '{msg}' for Layout<{d}>")
    if any(pad != "true" for _, _, pad in fired) or "kPad=false" in out:
        problems.append(f"pads of 0: an error in an unpadded Layout<D, false>:\n{out}")

    for p in problems:
        print(f"FAIL: {p}")
    if not problems:
        print(f"exercise.padding: Layout's pads hold for d = {dims}; the blank region and pads "
              "of 0 fail to compile, naming the region and the four conflicting accesses")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
