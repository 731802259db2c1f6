#!/usr/bin/env python3
"""Exercise mode: turn a step into a course exercise, and grade it with the ladder's tests.

A step's source marks its core regions:

    // EXERCISE BEGIN <region-name>
    // hint: the comment lines right after BEGIN, up to the first line that is not a comment
    <solution code>
    // EXERCISE END

`create` copies steps/NN_name/ to <dir>/NN_name/ and replaces the solution code of each region
with LADDER_TODO("<region-name>"); (common/exercise.hpp), keeping the markers and the hint.
Configuring with -DLADDER_EXERCISES=<dir> builds that copy instead of the solution, so the
same harness grades it.

  tools/exercise.py list                      every step and its regions
  tools/exercise.py create 2                  exercises/02_online_softmax/, every region
  tools/exercise.py create 0 --region backward-products
  tools/exercise.py grade 2                   build the copy and run its tests: PASS or FAIL
  tools/exercise.py diff 2                    the copy against the solution
  tools/exercise.py create 2 --force          start over (the old copy is kept in a backup)

Relative --dir and --build paths are taken from the repository root, as CMake takes
LADDER_EXERCISES. Exit status: 0 ok (grade: PASS), 1 grade FAIL, 2 bad use,
3 the grade could not run here (a GPU step with no CUDA device or toolkit).
"""
import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ROOT / "steps"
SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh", ".inl"}
BEGIN = re.compile(r"^(\s*)//\s*EXERCISE BEGIN\b\s*(.*?)\s*$")
END = re.compile(r"^\s*//\s*EXERCISE END\b")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
COMMENT = re.compile(r"^\s*//")

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3


class UsageError(Exception):
    """Bad use or a malformed marker: printed as `error: ...`, exit status 2."""


@dataclass
class Region:
    name: str
    path: Path  # the source file, inside a step folder
    begin: int  # 0-based line indices of the BEGIN and END markers
    end: int
    hint: list = field(default_factory=list)  # the hint's comment lines, as written
    solution: tuple = (0, 0)  # [first, last) line indices of the solution code

    def first_hint(self):
        for line in self.hint:
            text = line.strip().lstrip("/").strip()
            if text:
                return text
        return ""


@dataclass
class StepDir:
    number: int
    name: str  # the folder name, e.g. 02_online_softmax
    path: Path

    @property
    def nn(self):
        return f"{self.number:02d}"


def read_lines(path):
    # newline="" keeps each line's own ending, so a copy differs only where it must.
    with open(path, encoding="utf-8", newline="") as f:
        return f.read().splitlines(keepends=True)


def steps():
    found = []
    for d in sorted(STEPS.iterdir()):
        m = re.match(r"^(\d\d)_\w+$", d.name)
        if d.is_dir() and m:
            found.append(StepDir(int(m.group(1)), d.name, d))
    return found


def find_step(arg):
    """N, NN or NN_name -> the step folder."""
    for s in steps():
        if arg in (s.name, s.nn, str(s.number)):
            return s
    names = ", ".join(s.name for s in steps())
    raise UsageError(f"no step '{arg}' (the steps are: {names})")


def source_files(folder):
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES)


def parse_regions(path):
    """The regions of one file, checked: paired, not nested, named, with code inside."""
    lines = read_lines(path)
    regions, open_region = [], None
    where = lambda i: f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{i + 1}"
    for i, line in enumerate(lines):
        m = BEGIN.match(line)
        if m:
            if open_region:
                raise UsageError(f"{where(i)}: EXERCISE BEGIN inside region "
                                 f"'{open_region.name}' (regions do not nest)")
            name = m.group(2)
            if not NAME.match(name):
                raise UsageError(f"{where(i)}: EXERCISE BEGIN needs a region name "
                                 f"(letters, digits, '-', '_', '.'), got '{name}'")
            open_region = Region(name, path, i, -1)
        elif END.match(line):
            if not open_region:
                raise UsageError(f"{where(i)}: EXERCISE END without a BEGIN")
            r, open_region = open_region, None
            first = r.begin + 1
            while first < i and COMMENT.match(lines[first]):
                first += 1
            r.end, r.hint, r.solution = i, lines[r.begin + 1:first], (first, i)
            if not any(l.strip() for l in lines[first:i]):
                raise UsageError(f"{where(r.begin)}: region '{r.name}' has no solution code "
                                 "between its hint and EXERCISE END")
            regions.append(r)
    if open_region:
        raise UsageError(f"{where(open_region.begin)}: region '{open_region.name}' has no "
                         "EXERCISE END")
    return regions


def step_regions(step):
    regions = [r for f in source_files(step.path) for r in parse_regions(f)]
    seen = {}
    for r in regions:
        if r.name in seen:
            raise UsageError(f"step {step.name}: region name '{r.name}' is used twice "
                             f"({seen[r.name].path.name}:{seen[r.name].begin + 1} and "
                             f"{r.path.name}:{r.begin + 1}); names must be unique in a step")
        seen[r.name] = r
    return regions


def is_gpu_step(step):
    """A CUDA rung has .cu sources, or is registered as ladder_add_step(NN_name CUDA ...)."""
    text = (STEPS / "CMakeLists.txt").read_text(encoding="utf-8")
    registered = re.search(rf"ladder_add_step\(\s*{re.escape(step.name)}\s+CUDA\b", text)
    return registered is not None or any(step.path.rglob("*.cu"))


def rel(path):
    """A path as a learner would type it from the repository root."""
    path = Path(path)
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def from_root(path):
    path = Path(path).expanduser()
    return path if path.is_absolute() else ROOT / path


def shell_args(*parts):
    return " ".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# list


def cmd_list(args):
    if args.markdown:
        return list_markdown()
    for step in steps():
        regions = step_regions(step)
        kind = "GPU" if is_gpu_step(step) else "CPU"
        print(f"{step.name} ({kind}): " +
              (f"{len(regions)} region(s)" if regions else "no exercise regions yet"))
        for r in regions:
            print(f"  {r.name:<24} {rel(r.path)}:{r.begin + 1}")
            if r.first_hint():
                print(f"  {'':<24} {r.first_hint()}")
    return EXIT_OK


def list_markdown():
    """The exercises as a Markdown table (notes/EXERCISES.md keeps a copy)."""
    print("| step | region | where | what to write (the hint) |")
    print("|---|---|---|---|")
    for step in steps():
        for r in step_regions(step):
            hint = " ".join(l.strip().lstrip("/").strip() for l in r.hint).strip()
            hint = hint.replace("|", "\\|")  # a '|' would end the table cell
            where = f"{rel(r.path)}:{r.begin + 1}"
            print(f"| {step.name} | `{r.name}` | [{where}](../{rel(r.path)}#L{r.begin + 1}) | "
                  f"{hint} |")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# create


def exercise_text(lines, regions):
    """The file with each region's solution replaced by LADDER_TODO at its indentation."""
    out, i = [], 0
    for r in sorted(regions, key=lambda r: r.begin):
        first, last = r.solution
        # The first code line's indentation; a preprocessor line (#pragma unroll) sits at
        # column 0 whatever the code's depth, so skip those.
        code = [l for l in lines[first:last] if l.strip() and not l.lstrip().startswith("#")]
        indent = re.match(r"^[ \t]*", code[0] if code else lines[r.begin]).group(0)
        eol = "\r\n" if lines[first].endswith("\r\n") else "\n"
        out += lines[i:first]
        out.append(f'{indent}LADDER_TODO("{r.name}");{eol}')
        i = last  # resume at the END marker
    out += lines[i:]
    return "".join(out)


def cmd_create(args):
    step = find_step(args.step)
    regions = step_regions(step)
    if not regions:
        raise UsageError(f"step {step.name} has no exercise regions yet (see notes/EXERCISES.md "
                         "for how to mark one)")
    if args.region:
        known = {r.name for r in regions}
        unknown = [n for n in args.region if n not in known]
        if unknown:
            raise UsageError(f"step {step.name} has no region {', '.join(unknown)}; its regions "
                             f"are: {', '.join(r.name for r in regions)}")
        regions = [r for r in regions if r.name in args.region]
    root = from_root(args.dir)
    dest = root / step.name
    if dest.exists():
        if not args.force:
            print(f"error: {rel(dest)} already exists and may hold your work; it was left as it "
                  f"is.\nTo start over, run with --force (the old copy is moved to "
                  f"{rel(root / '.backup')}/).", file=sys.stderr)
            return EXIT_USAGE
        backup = root / ".backup" / f"{step.name}.{time.strftime('%Y%m%d-%H%M%S')}"
        n = 1
        while backup.exists():  # two resets in one second
            backup = backup.with_name(f"{backup.name.split('~')[0]}~{n}")
            n += 1
        backup.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(dest), str(backup))
        print(f"moved the old copy to {rel(backup)}")
    # Build the whole copy next to its destination, then rename: no half-written exercise.
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{step.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(step.path, tmp)
    for src in sorted({r.path for r in regions}):
        mine = [r for r in regions if r.path == src]
        with open(tmp / src.relative_to(step.path), "w", encoding="utf-8", newline="") as f:
            f.write(exercise_text(read_lines(src), mine))
    os.replace(tmp, dest)

    opt_dir = "" if args.dir == "exercises" else f"--dir {args.dir}"
    print(f"created {rel(dest)}/ from {rel(step.path)}/ with {len(regions)} region(s) to write:")
    for r in regions:
        print(f"  {r.name:<24} {rel(dest / r.path.relative_to(step.path))}:{r.begin + 1}")
        if r.first_hint():
            print(f"  {'':<24} {r.first_hint()}")
    print("next:")
    print("  edit each region: replace LADDER_TODO(...) with your code")
    print(f"  {shell_args('tools/exercise.py grade', step.nn, opt_dir)}"
          "      # build your copy, run its tests: PASS or FAIL")
    print(f"  {shell_args('tools/exercise.py diff', step.nn, opt_dir)}"
          "       # your copy against the solution")
    print(f"  {shell_args('tools/exercise.py create', step.nn, opt_dir, '--force')}"
          "  # start over (keeps a backup)")
    print(f"  by hand: cmake -S . -B build-exercises -G Ninja -DCMAKE_BUILD_TYPE=Release "
          f"-DLADDER_EXERCISES={rel(root)} && cmake --build build-exercises --target "
          f"{step.name} && build-exercises/steps/{step.name}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# grade


def run(cmd, capture=False):
    print("+ " + shlex.join(str(c) for c in cmd), flush=True)
    if not capture:
        return subprocess.run([str(c) for c in cmd]).returncode, ""
    # Echo as it runs (a grade takes a while) and keep the text to look for skipped tests.
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace")
    text = []
    for line in p.stdout:
        sys.stdout.write(line)
        text.append(line)
    sys.stdout.flush()
    return p.wait(), "".join(text)


def cmd_grade(args):
    step = find_step(args.step)
    ex_dir = from_root(args.dir)
    copy = ex_dir / step.name
    if not copy.is_dir():
        opt_dir = "" if args.dir == "exercises" else f" --dir {args.dir}"
        raise UsageError(f"no exercise copy {rel(copy)}/: make one with "
                         f"tools/exercise.py create {step.nn}{opt_dir}")
    build = from_root(args.build)
    rc, out = run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                   f"-DLADDER_EXERCISES={ex_dir}"], capture=True)
    if rc != 0:
        print(f"FAIL: configuring {rel(build)} failed (cmake exit status {rc})")
        return EXIT_FAIL
    if is_gpu_step(step) and re.search(r"CUDA rungs OFF", out):
        print(f"NOT RUN: {step.name} is a GPU step and {rel(build)} builds no CUDA rungs (no "
              "CUDA toolkit was found, or LADDER_ENABLE_CUDA=OFF): it can be neither built nor "
              "graded here.")
        return EXIT_NOT_RUN
    # Step 00's harness compares the oracle with itself: its real grade is the oracle's own
    # tests in ladder_tests (tests/test_reference.cpp: a long-double brute force, central
    # finite differences of the gradients, and plain_attention, the tolerance yardstick).
    targets = [step.name, "harness"] + (["ladder_tests"] if step.number == 0 else [])
    build_cmd = ["cmake", "--build", build, "--target", *targets]
    if args.jobs:
        build_cmd += ["-j", str(args.jobs)]
    rc, _ = run(build_cmd)
    if rc != 0:
        print(f"FAIL: your copy does not build (see the compiler's messages above; "
              f"cmake --build exit status {rc})")
        return EXIT_FAIL
    tests = rf"^harness\.{step.nn}_"
    if step.number == 0:
        tests += "|oracle|reference|plain_attention"
    rc, out = run(["ctest", "--test-dir", build, "-R", tests, "--output-on-failure",
                   "--no-tests=error"], capture=True)
    # The harness exits 77 without a CUDA device, which ctest counts as skipped, not failed.
    skipped = re.search(r"\*\*\*Skipped|The following tests did not run", out) is not None
    if rc == 0 and skipped:
        print(f"NOT RUN: {step.name} built, but its tests could not run here (no CUDA device); "
              "grade it on a machine with an NVIDIA GPU.")
        return EXIT_NOT_RUN
    if rc == 0:
        print(f"PASS: {step.name} from {rel(copy)}/ (ctest exit status 0)")
        return EXIT_OK
    print(f"FAIL: {step.name} from {rel(copy)}/ (ctest exit status {rc}); a region still at "
          "LADDER_TODO fails with 'not implemented'")
    return EXIT_FAIL


# ---------------------------------------------------------------------------------------------
# diff


def cmd_diff(args):
    step = find_step(args.step)
    copy = from_root(args.dir) / step.name
    if not copy.is_dir():
        raise UsageError(f"no exercise copy {rel(copy)}/ (make one with tools/exercise.py "
                         f"create {step.nn})")
    names = sorted({p.relative_to(step.path) for p in step.path.rglob("*") if p.is_file()} |
                   {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()})
    changed = 0
    for name in names:
        a, b = step.path / name, copy / name
        label_a, label_b = rel(a), rel(b)
        try:
            lines_a = read_lines(a) if a.exists() else []
            lines_b = read_lines(b) if b.exists() else []
        except UnicodeDecodeError:
            if not a.exists() or not b.exists() or a.read_bytes() != b.read_bytes():
                print(f"binary files {label_a} and {label_b} differ")
                changed += 1
            continue
        if not a.exists():
            label_a = "/dev/null"
        if not b.exists():
            label_b = "/dev/null"
        diff = list(difflib.unified_diff(lines_a, lines_b, label_a, label_b))
        if diff:
            changed += 1
            for line in diff:
                sys.stdout.write(line if line.endswith("\n") else line + "\n\\ No newline at "
                                 "end of file\n")
    if changed == 0:
        print(f"{rel(copy)}/ is identical to the solution {rel(step.path)}/")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tools/exercise.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = sub.add_parser("list", help="every step and its exercise regions")
    p.add_argument("--markdown", action="store_true", help="as the Markdown table of "
                   "notes/EXERCISES.md")
    p = sub.add_parser("create", help="copy a step with its regions replaced by LADDER_TODO")
    p.add_argument("step", help="step number (2, 02) or folder name (02_online_softmax)")
    p.add_argument("--dir", default="exercises", help="folder of exercise copies (default "
                   "exercises)")
    p.add_argument("--region", nargs="+", metavar="NAME", help="only these regions (default "
                   "all)")
    p.add_argument("--force", action="store_true", help="replace an existing copy (it is moved "
                   "to DIR/.backup/ first, never deleted)")
    p = sub.add_parser("grade", help="build the exercise copy and run its tests")
    p.add_argument("step")
    p.add_argument("--dir", default="exercises")
    p.add_argument("--build", default="build-exercises", help="build folder (default "
                   "build-exercises)")
    p.add_argument("--jobs", "-j", type=int, help="parallel compile jobs (default: ninja's)")
    p = sub.add_parser("diff", help="unified diff of the exercise copy against the solution")
    p.add_argument("step")
    p.add_argument("--dir", default="exercises")
    args = ap.parse_args(argv)
    verbs = {"list": cmd_list, "create": cmd_create, "grade": cmd_grade, "diff": cmd_diff}
    try:
        return verbs[args.verb](args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
