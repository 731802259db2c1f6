#!/usr/bin/env python3
"""notes.course: every exercise region notes/COURSE.md names exists in the source.

COURSE.md names a region as `NN:region` (step NN's region `region`), in backticks. Each must be
a region that tools/exercise.py finds between the EXERCISE BEGIN/END markers of steps/NN_*/, so
a renamed or removed region cannot leave the course pointing at nothing. Regions the course does
not name are listed, not failed (a new region may wait for its session).

  check_course.py [ROOT]     report every unknown region; exit 1 if there is one
"""
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`(\d\d):([A-Za-z0-9][A-Za-z0-9_.-]*)`")


def source_regions():
    spec = importlib.util.spec_from_file_location("exercise", ROOT / "tools" / "exercise.py")
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    ex.STEPS = ROOT / "steps"  # the tree under test, wherever the script lives
    return {(s.nn, r.name) for s in ex.steps() for r in ex.step_regions(s)}


def main():
    course = ROOT / "notes" / "COURSE.md"
    if not course.is_file():
        print(f"{course}: missing")
        return 1
    named = NAMED.findall(course.read_text(encoding="utf-8"))
    known = source_regions()
    unknown = sorted({n for n in named if n not in known})
    for nn, name in unknown:
        print(f"notes/COURSE.md: `{nn}:{name}` is no exercise region of step {nn} "
              f"(tools/exercise.py list)")
    if not named:
        print("notes/COURSE.md: names no exercise region (`NN:region`)")
    for nn, name in sorted(known - set(named)):
        print(f"note: region {nn}:{name} is in no session of notes/COURSE.md")
    return 1 if unknown or not named else 0


if __name__ == "__main__":
    sys.exit(main())
