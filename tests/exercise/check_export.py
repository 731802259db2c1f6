#!/usr/bin/env python3
"""exercise.export: a handout (tools/exercise.py export) and a learner's copy (create) give no
solution away.

  check_export.py SOURCE_DIR SCRATCH_DIR [--build]

Checks, from the solved tree SOURCE_DIR:
- create, for every step with regions: no file of the copy other than the blanked sources
  quotes a solution line (tools/exercise.py solution_lines: a region's code line found nowhere
  outside the regions), and the copy's README is the exercise sheet, not the step's README
  (step 02's names the rescale factor its regions compute);
- export: every file of the handout, sources included, is free of solution lines; every region
  is LADDER_TODO there; no .git, .ci/, python/ or notes/results log came along; the notes, the
  results CSVs and the figures the notes show did.
- --build (the slow test exercise.export.build): the handout builds and grades on its own: its
  tools/exercise.py creates step 02's copy and grades it in SCRATCH_DIR/build (CUDA off), which
  must FAIL as not implemented, every region named.
The scratch folders are this test's own (SCRATCH_DIR/handout, SCRATCH_DIR/create-*), remade
each run.
"""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

src, scratch = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
build_too = "--build" in sys.argv[3:]
spec = importlib.util.spec_from_file_location("exercise", src / "tools" / "exercise.py")
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL: {msg}")


def tool(root, *args):
    return subprocess.run([sys.executable, str(root / "tools" / "exercise.py"), *map(str, args)],
                          capture_output=True, text=True)


everything = [(s, ex.step_regions(s)) for s in ex.steps()]
regions = [r for _, rs in everything for r in rs]
solutions = ex.solution_lines(regions)
print(f"{len(regions)} regions, {len(solutions)} distinctive solution lines")
if len(solutions) < len(regions):  # a check over nothing would pass anything
    fail(f"only {len(solutions)} solution lines to look for, for {len(regions)} regions")

print("== create: no text of a copy quotes its solution")
for step, rs in everything:
    if not rs:
        continue
    d = scratch / f"create-{step.nn}"
    shutil.rmtree(d, ignore_errors=True)
    p = tool(src, "create", step.nn, "--dir", d)
    if p.returncode != 0:
        fail(f"create {step.nn}: exit {p.returncode}: {p.stderr.strip()}")
        continue
    if "graded on: " not in p.stdout:
        fail(f"create {step.nn} did not say what hardware grades the copy")
    copy = d / step.name
    for f, line, names in ex.handout_leaks(copy, ex.solution_lines(rs)):
        if f.suffix not in ex.SOURCE_SUFFIXES:
            fail(f"create {step.nn}: {f.relative_to(d)}:{line} quotes the solution of {names}")
    readme = (copy / "README.md").read_text(encoding="utf-8")
    original = (step.path / "README.md").read_text(encoding="utf-8")
    if not readme.startswith("# Exercise:") or readme == original:
        fail(f"create {step.nn}: README.md is not the exercise sheet")
    if step.nn == "02" and "m_\\text{old}" in readme:
        fail("create 02: the README still names the rescale factor")
    for f, line, names in ex.handout_leaks(copy, solutions):
        if f.suffix in ex.SOURCE_SUFFIXES:
            fail(f"create {step.nn}: {f.relative_to(d)}:{line} still holds the solution of "
                 f"{names}")
    shutil.rmtree(d)

print("== export: the handout holds no solution and no history")
hand = scratch / "handout"
shutil.rmtree(hand, ignore_errors=True)
p = tool(src, "export", hand)
print(p.stdout, end="")
if p.returncode != 0:
    fail(f"export: exit {p.returncode}: {p.stderr.strip()}")
else:
    for f, line, names in ex.handout_leaks(hand, solutions):
        fail(f"export: {f.relative_to(hand)}:{line} quotes the solution of {names}")
    for step, rs in everything:
        for r in rs:
            text = (hand / r.path.relative_to(src)).read_text(encoding="utf-8")
            if f'LADDER_TODO("{r.name}");' not in text:
                fail(f"export: region {step.nn}:{r.name} is not blank in the handout")
    for gone in (".git", ".ci", "python", "notes/results/cpu_log.md", "notes/results/05_log.md",
                 "tests/exercise/test_exercise.sh"):
        if (hand / gone).exists():
            fail(f"export: {gone} is in the handout")
    logs = [f for f in (hand / "notes" / "results").rglob("*") if f.suffix != ".csv"]
    if logs:
        fail(f"export: notes/results holds {len(logs)} files other than the CSVs: {logs[:3]}")
    for kept in ("CMakeLists.txt", "HANDOUT.md", "notes/COURSE.md", "notes/EXERCISES.md",
                 "notes/results/h100.csv", "notes/results/ceilings.csv", "tests/harness.cpp",
                 "tools/exercise.py", "reference/oracle.cpp", "common/exercise.hpp"):
        if not (hand / kept).is_file():
            fail(f"export: {kept} is missing from the handout")
    shown = {f.name for f in (hand / "notes" / "figures").glob("*")}
    if "h100_variants_05.svg" not in shown:  # EXERCISES.md shows it
        fail("export: a figure the notes show is missing (h100_variants_05.svg)")
    p = tool(hand, "list", "--markdown", "--check")
    if p.returncode != 0:
        fail(f"export: the handout's exercise table does not match its regions: {p.stdout}")

if build_too and not failures:
    print("== the handout builds and grades step 02 (FAIL: not implemented)")
    build = scratch / "build"
    if build.exists() and ex.cached_settings(build).get("CMAKE_HOME_DIRECTORY") != str(hand):
        shutil.rmtree(build)  # ours, from another handout path
    p = tool(hand, "create", "2")
    if p.returncode != 0:
        fail(f"handout create 2: exit {p.returncode}: {p.stderr.strip()}")
    else:
        p = tool(hand, "grade", "2", "--build", build)
        out = p.stdout + p.stderr
        if p.returncode != 1 or "\nFAIL: 02_online_softmax" not in "\n" + out:
            print(out[-3000:])
            fail(f"handout grade 2: exit {p.returncode}, not a FAIL")
        elif "not implemented: 'online-max-sum'" not in out or "'tile-update'" not in out:
            print(out[-3000:])
            fail("handout grade 2 did not name the blank regions")
        elif "does not build" in out:
            fail("the handout's copy of step 02 does not build")
        else:
            print("handout grade 2: FAIL, not implemented, as it should")

print("exercise.export: " + ("every check passed" if not failures else
                              f"{len(failures)} failure(s)"))
sys.exit(1 if failures else 0)
