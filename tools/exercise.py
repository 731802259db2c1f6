#!/usr/bin/env python3
"""Exercise mode: turn a step into a course exercise, and grade it with the ladder's tests.

A step's source marks its core regions:

    // EXERCISE BEGIN <region-name> [easy|medium|hard]
    // Concept: what the region checks that the learner understands (one or two lines).
    //
    // The hint: the comment lines after the concept, up to the first line that is not a comment.
    <solution code>
    // EXERCISE END

`create` copies steps/NN_name/ to <dir>/NN_name/ and replaces the solution code of each region
with LADDER_TODO("<region-name>"); (common/exercise.hpp), keeping the markers, the concept and
the hint. Configuring with -DLADDER_EXERCISES=<dir> builds that copy instead of the solution, so
the same harness grades it.

  tools/exercise.py list                      every step and its regions
  tools/exercise.py list --markdown           the table of notes/EXERCISES.md
  tools/exercise.py list --markdown --write   refresh that table in place (--check: is it current?)
  tools/exercise.py create 2                  exercises/02_online_softmax/, every region
  tools/exercise.py create 2 --region tile-update
  tools/exercise.py grade 2                   build the copy and run its tests: PASS or FAIL
  tools/exercise.py diff 2                    the copy against the solution
  tools/exercise.py create 2 --force          start over (the old copy is kept in a backup)
  tools/exercise.py export handout/           a handout: every step blanked, the notes, the
                                              harness and the build; no solution, no history

Each step's regions are graded on the hardware that runs the step's tests: the CPU (steps 01,
02), a CUDA GPU (03-06) or a Hopper GPU (07, sm_90a); `list`, the table and `create` say which.
A copy's README.md is an exercise sheet (the step's README describes the solution), and any other
copied text that quotes a region's solution line has that line replaced. After a PASS, `grade`
times the copy's default variant at one problem (SPEED_POINT) and prints its TFLOP/s beside the
GPU's measured ceiling and the solution's committed figure (--no-timing: not at all).

--dir may not be steps/ or a folder inside it. Only folders this tool made are ever removed.

Relative --dir and --build paths are taken from the repository root, as CMake takes
LADDER_EXERCISES. An empty --dir or --build is refused ("" is not the repository root), and so
is a symbolic link, a FIFO or a device (tools/pathargs.py). --build must be a folder of its own:
new, empty, or one an earlier grade configured (its CMakeCache.txt names this repository and
sets LADDER_EXERCISES); the main build (build/), a build of another tree, the repository itself
and any other folder holding files are refused, never reconfigured. A create that fails (a full
disk, a folder that cannot be written) says why in one line and leaves no folder it made.
`export DIR` writes only into a new or empty DIR, outside steps/, and writes nothing if any file
of the handout would quote a solution line.
Exit status: 0 ok (grade: PASS: at least one case ran, every one passed), 1
grade FAIL (list --check: the table is stale), 2 bad use, 3 the grade could not run here (a GPU step with no CUDA device or toolkit).
"""
import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import pathargs  # noqa: E402  (the path-argument rule of every tool)

STEPS = ROOT / "steps"
EXERCISES_MD = ROOT / "notes" / "EXERCISES.md"
SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh", ".inl"}
DIFFICULTIES = ("easy", "medium", "hard")
BEGIN = re.compile(r"^(\s*)//\s*EXERCISE BEGIN\b\s*(.*?)\s*$")
END = re.compile(r"^\s*//\s*EXERCISE END\b")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
COMMENT = re.compile(r"^\s*//")
# What follows BEGIN: the name, then optionally [difficulty] and "concept: ..."
BEGIN_ARGS = re.compile(r"^(\S+)(?:\s+\[(\w+)\])?(?:\s+concept:\s*(.*))?$", re.IGNORECASE)
CONCEPT = re.compile(r"^concept:\s*(.*)$", re.IGNORECASE)
# The slowest objects of a grade build (a Catch2 main, and CLI11 behind the command line).
FIRST_OBJECTS = ("tests/CMakeFiles/harness.dir/harness.cpp.o",
                 "common/CMakeFiles/ladder_common.dir/cli.cpp.o")
TABLE_BEGIN, TABLE_END = "<!-- exercises:begin -->", "<!-- exercises:end -->"

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NOT_RUN = 0, 1, 2, 3

# Step 00's algorithm is the oracle in reference/ (shared with the checker): an exercise copy of
# steps/00_cpu_reference would blank nothing that the grade could test without grading the
# oracle against itself.
NO_EXERCISE = {0: "step 00 is the float64 oracle (reference/oracle.cpp), the code every grade "
                  "checks against: blanking it would grade the oracle with itself. Its exercise "
                  "is a derivation: notes/00_cpu_reference.md, Exercise 2."}


class UsageError(Exception):
    """Bad use or a malformed marker: printed as `error: ...`, exit status 2."""


@dataclass
class Region:
    name: str
    path: Path  # the source file, inside a step folder
    begin: int  # 0-based line indices of the BEGIN and END markers
    end: int
    difficulty: str = ""
    concept: str = ""
    hint: list = field(default_factory=list)  # the comment lines after BEGIN, as written
    solution: tuple = (0, 0)  # [first, last) line indices of the solution code


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
            a = BEGIN_ARGS.match(m.group(2))
            if not a or not NAME.match(a.group(1)):
                raise UsageError(f"{where(i)}: EXERCISE BEGIN needs a region name (letters, "
                                 f"digits, '-', '_', '.'), then optionally [easy|medium|hard] "
                                 f"and 'concept: ...'; got '{m.group(2)}'")
            difficulty = (a.group(2) or "").lower()
            if difficulty and difficulty not in DIFFICULTIES:
                raise UsageError(f"{where(i)}: difficulty '[{a.group(2)}]' is not one of "
                                 f"{', '.join(DIFFICULTIES)}")
            open_region = Region(a.group(1), path, i, -1, difficulty, (a.group(3) or "").strip())
        elif END.match(line):
            if not open_region:
                raise UsageError(f"{where(i)}: EXERCISE END without a BEGIN")
            r, open_region = open_region, None
            first = r.begin + 1
            while first < i and COMMENT.match(lines[first]):
                first += 1
            r.end, r.hint, r.solution = i, lines[r.begin + 1:first], (first, i)
            if not r.concept:  # a "Concept:" paragraph at the top of the hint
                concept, in_concept = [], False
                for l in r.hint:
                    text = l.strip()[2:].strip()
                    c = CONCEPT.match(text)
                    if c and not concept:
                        in_concept = True
                        concept.append(c.group(1))
                    elif in_concept and text:
                        concept.append(text)
                    elif in_concept:
                        break
                r.concept = " ".join(concept).strip()
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


def unrated(regions):
    """Regions without a difficulty or a concept: `file:line name (what is missing)`."""
    out = []
    for r in regions:
        missing = [w for w, v in (("[difficulty]", r.difficulty), ("Concept:", r.concept)) if not v]
        if missing:
            out.append(f"{rel(r.path)}:{r.begin + 1} {r.name} (no {' and no '.join(missing)})")
    return out


def step_flags(step):
    """The flags steps/CMakeLists.txt registers the step with (ladder_add_step(NN_name CUDA
    SM90A ... SOURCES ...)): the words between the name and SOURCES."""
    text = (STEPS / "CMakeLists.txt").read_text(encoding="utf-8")
    m = re.search(rf"ladder_add_step\(\s*{re.escape(step.name)}\b(.*?)\bSOURCES\b", text, re.S)
    return set(m.group(1).split()) if m else set()


def is_gpu_step(step):
    """A CUDA rung has .cu sources, or is registered as ladder_add_step(NN_name CUDA ...)."""
    return "CUDA" in step_flags(step) or any(step.path.rglob("*.cu"))


# What grades a step's regions, by the step's kind: its tests run on the CPU, on any CUDA GPU
# the build targets, or only on a Hopper GPU (the SM90A flag: wgmma, setmaxnreg and TMA exist
# only for sm_90a).
HARDWARE = {"cpu": "CPU", "gpu": "CUDA GPU", "hopper": "Hopper GPU (sm_90a)"}
HARDWARE_NEEDS = {
    "cpu": "a CPU: the C++ compiler and CMake (no CUDA toolkit, no GPU)",
    "gpu": "an NVIDIA GPU and the CUDA toolkit (nvcc); without a GPU the copy is compiled but "
           "not graded (exit status 3)",
    "hopper": "a Hopper GPU (H100 or H200, sm_90a) and CUDA 12.0 or later; on another GPU, or "
              "none, it cannot be graded (exit status 3)",
}


def step_hardware(step):
    """'cpu', 'gpu' or 'hopper': what runs the step's tests, hence grades its regions."""
    if "SM90A" in step_flags(step):
        return "hopper"
    return "gpu" if is_gpu_step(step) else "cpu"


def rel(path):
    """A path as a learner would type it from the repository root."""
    path = Path(path)
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def from_root(path, arg):
    """A --dir or --build path, relative ones from the repository root; an empty path, a link, a
    FIFO, a device or a file where a folder is wanted is refused (tools/pathargs.py)."""
    try:
        pathargs.output_dir(path, arg)  # an empty path names no folder ("" is not ROOT)
        p = Path(path).expanduser()
        p = p if p.is_absolute() else ROOT / p
        pathargs.output_dir(p, arg)
    except pathargs.PathError as e:
        raise UsageError(str(e)) from None
    return p


def check_build_dir(build):
    """--build must be a folder this tool may configure: absent, empty, or an earlier grade
    build of this source (its CMakeCache.txt names this repository and has LADDER_EXERCISES
    set). The main build (LADDER_EXERCISES empty), a build of another source tree, the
    repository itself or any other folder with files in it is refused: grading would
    reconfigure it (CUDA off, one step) or configure CMake among files that are not a build."""
    r = build.resolve()
    if r == ROOT.resolve() or r in ROOT.resolve().parents:
        raise UsageError(f"--build {build}: is the repository or a folder above it, not a build "
                         "folder (CMake would configure in the source tree); give a folder of "
                         "its own, e.g. --build build-exercises")
    if not build.exists() or not any(build.iterdir()):
        return
    cache = build / "CMakeCache.txt"
    if pathargs.input_file(cache, "--build", missing_ok=True) is None:
        raise UsageError(f"--build {rel(build)}: holds files but no CMakeCache.txt: not a build "
                         "folder; give an empty or new folder (default build-exercises)")
    have = cached_settings(build)
    home = have.get("CMAKE_HOME_DIRECTORY", "")
    if not home or Path(home).resolve() != ROOT.resolve():
        raise UsageError(f"--build {rel(build)}: is the build of another source tree "
                         f"({home or 'unknown'}), not of {ROOT}; give another folder (default "
                         "build-exercises)")
    if not have.get("LADDER_EXERCISES"):
        raise UsageError(f"--build {rel(build)}: is a build of the solution (LADDER_EXERCISES is "
                         "not set there); grading would reconfigure it to build only your copy "
                         "of one step, CUDA off for a CPU step. Give a folder of its own: the "
                         "default build-exercises, or any new folder")


def shell_args(*parts):
    return " ".join(p for p in parts if p)


# ---------------------------------------------------------------------------------------------
# list


def cmd_list(args):
    if args.markdown or args.write or args.check:
        return list_markdown(args)
    everything = []
    for step in steps():
        regions = step_regions(step)
        everything += regions
        kind = f"graded on: {HARDWARE[step_hardware(step)]}"
        if step.number in NO_EXERCISE and not regions:
            print(f"{step.name} ({HARDWARE[step_hardware(step)]}): no exercise regions: "
                  f"{NO_EXERCISE[step.number]}")
            continue
        print(f"{step.name} ({kind}): " +
              (f"{len(regions)} region(s)" if regions else "no exercise regions yet"))
        for r in regions:
            print(f"  {r.name:<24} [{r.difficulty or '?'}] {rel(r.path)}:{r.begin + 1}")
            if r.concept:
                print(f"  {'':<24} concept: {r.concept}")
    for line in unrated(everything):
        print(f"warning: {line}: every region needs both (notes/EXERCISES.md)", file=sys.stderr)
    return EXIT_OK


def markdown_table():
    """The exercises as a Markdown table (notes/EXERCISES.md keeps a copy between markers)."""
    rows = ["| step | region | difficulty | the concept it checks | graded on | file |",
            "|---|---|---|---|---|---|"]
    for step in steps():
        regions = step_regions(step)
        hardware = HARDWARE[step_hardware(step)]
        if not regions and step.number in NO_EXERCISE:
            rows.append(f"| {step.name} | none | | a derivation instead: see \"Step 00\" below "
                        "| by hand | |")
        for r in regions:
            concept = (r.concept.rstrip(".") or "(not rated yet)").replace("|", "\\|")
            rows.append(f"| {step.name} | `{r.name}` | {r.difficulty or '?'} | {concept} | "
                        f"{hardware} | [`{r.path.name}`](../{rel(r.path)}) |")
    return "\n".join(rows) + "\n"


def list_markdown(args):
    table = markdown_table()
    if not (args.write or args.check):
        sys.stdout.write(table)
        return EXIT_OK
    text = EXERCISES_MD.read_text(encoding="utf-8")
    a, b = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if a < 0 or b < a:
        raise UsageError(f"{rel(EXERCISES_MD)} has no {TABLE_BEGIN} ... {TABLE_END} markers")
    new = text[:a + len(TABLE_BEGIN)] + "\n" + table + text[b:]
    if args.check:
        if new != text:
            print(f"{rel(EXERCISES_MD)}: the exercise table is stale; refresh it with "
                  "tools/exercise.py list --markdown --write")
            return EXIT_FAIL
        print(f"{rel(EXERCISES_MD)}: the exercise table matches the regions")
        return EXIT_OK
    if new != text:
        pathargs.write_atomic(EXERCISES_MD, new, rel(EXERCISES_MD))
        print(f"refreshed the exercise table in {rel(EXERCISES_MD)}")
    else:
        print(f"{rel(EXERCISES_MD)} is current")
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


# A solution line counts as given away when a copied text quotes it: a code line of a region's
# solution, whitespace collapsed, at least this long, and neither a comment, a preprocessor line
# (#pragma unroll) nor bare punctuation. Shorter lines (`break;`, `}`) say nothing on their own.
MIN_SOLUTION_LINE = 16


def norm_code(line):
    return re.sub(r"\s+", " ", line.strip())


# The source folders whose code a learner sees whole (a step's code outside its regions too).
CODE_FOLDERS = ("common", "reference", "runner", "steps", "tests", "tools")


def code_outside_regions():
    """The set of every code line of the repository's sources that is not inside a region's
    solution, normalised: a line there is no secret (a loop header, a launch check, the oracle's own
    arithmetic), whichever region also has it."""
    seen = set()
    for top in CODE_FOLDERS:
        for f in source_files(ROOT / top):
            lines = read_lines(f)
            inside = set()
            if f.is_relative_to(STEPS):
                for r in parse_regions(f):
                    inside.update(range(*r.solution))
            seen.update(norm_code(l) for i, l in enumerate(lines) if i not in inside)
    return seen


def solution_lines(regions):
    """The lines that give a region's solution away: its code lines, whitespace collapsed, at
    least MIN_SOLUTION_LINE long, not comments or preprocessor lines, and found nowhere in the
    sources outside the regions. Normalised text -> region names."""
    # One string of every shared line: a solution line found in it (a line of its own or a
    # part of one) is no secret.
    out, shared = {}, "\n".join(sorted(code_outside_regions()))
    for r in regions:
        lines = read_lines(r.path)
        for line in lines[r.solution[0]:r.solution[1]]:
            t = norm_code(line)
            if len(t) >= MIN_SOLUTION_LINE and not t.startswith(("//", "#", "/*", "*")) and \
                    t not in shared:
                out.setdefault(t, []).append(r.name)
    return out


def leaked_lines(text, solutions):
    """The lines of `text` that quote a solution line: [(line number, region names)]."""
    out = []
    for i, line in enumerate(text.splitlines()):
        n = norm_code(line)
        # A script may quote a line as a regular expression (sed 's/a \* b\[c\]/.../'): read
        # it without the backslashes too.
        bare = n.replace("\\", "")
        names = sorted({x for t, names in solutions.items() if t in n or t in bare
                        for x in names})
        if names:
            out.append((i + 1, names))
    return out


def redact(text, solutions):
    """`text` with every line that quotes a solution line replaced by a note saying whose; the
    number of lines replaced."""
    lines = text.splitlines(keepends=True)
    leaks = dict(leaked_lines(text, solutions))
    for i, names in leaks.items():
        eol = "\n" if lines[i - 1].endswith("\n") else ""
        indent = re.match(r"^[ \t>]*", lines[i - 1]).group(0)
        lines[i - 1] = (f"{indent}(a line of the solution of region "
                        f"{', '.join(repr(n) for n in names)}, left out of this copy){eol}")
    return "".join(lines), len(leaks)


def exercise_readme(step, regions):
    """The README of an exercise copy. The step's own README describes the solution (step 02's
    names the rescale factor its regions compute), so the copy gets this one instead: what to
    write, what grades it, where to read."""
    note = ROOT / "notes" / f"{step.name}.md"
    lines = [f"# Exercise: step {step.name}", "",
             f"Your copy of `steps/{step.name}/` with {len(regions)} exercise region(s) "
             "blanked to `LADDER_TODO`. The step's own README describes the solution, so it is "
             "not in this copy: read the note"
             + (f", [notes/{note.name}](../../notes/{note.name})" if note.is_file() else "")
             + ", then the concept and the hint in each region.", "",
             "| region | difficulty | file | the concept it checks |", "|---|---|---|---|"]
    for r in regions:
        concept = (r.concept.rstrip(".") or "(not rated yet)").replace("|", "\\|")
        lines.append(f"| `{r.name}` | {r.difficulty or '?'} | `{r.path.relative_to(step.path)}` "
                     f"| {concept} |")
    lines += ["", f"Graded on: {HARDWARE[step_hardware(step)]}. Grading needs "
              f"{HARDWARE_NEEDS[step_hardware(step)]}.", "",
              "```sh", f"tools/exercise.py grade {step.nn}    # PASS or FAIL, and why",
              f"tools/exercise.py diff {step.nn}     # your copy against the step it was made "
              "from", "```", ""]
    return "\n".join(lines)


def blank_step(step, regions, tmp):
    """Writes into `tmp` (a copy of the step folder) each file of `regions` blanked, the README
    replaced by exercise_readme, and every other text file with any line that quotes a solution
    line of the step's regions redacted. Returns the redacted files (relative paths)."""
    for src in sorted({r.path for r in regions}):
        mine = [r for r in regions if r.path == src]
        with open(tmp / src.relative_to(step.path), "w", encoding="utf-8", newline="") as f:
            f.write(exercise_text(read_lines(src), mine))
    readme = tmp / "README.md"
    if readme.exists():
        readme.write_text(exercise_readme(step, regions), encoding="utf-8")
    solutions = solution_lines(regions)
    redacted = []
    for f in sorted(p for p in tmp.rglob("*") if p.is_file() and p.suffix not in SOURCE_SUFFIXES
                    and p != readme):
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new, n = redact(text, solutions)
        if n:
            f.write_text(new, encoding="utf-8")
            redacted.append(f.relative_to(tmp))
    return redacted


def check_exercise_dir(root, dest):
    """Refuses an exercise folder in the steps/ folder (or a copy that would be steps/ or hold
    it): a copy there would replace the solution it is made from."""
    r, d = root.resolve(), dest.resolve()
    steps_dir = STEPS.resolve()
    if r == steps_dir or steps_dir in r.parents or d == steps_dir or d in steps_dir.parents:
        raise UsageError(f"--dir {rel(root)}: the exercise copies cannot go in {rel(STEPS)}/ "
                         "(the copy would replace the solution it is made from); use a folder "
                         "of its own, e.g. --dir exercises")
    if d.exists() and not d.is_dir():
        raise UsageError(f"{rel(dest)} exists and is not a folder; it was left as it is")


def cmd_create(args):
    step = find_step(args.step)
    regions = step_regions(step)
    if not regions:
        why = NO_EXERCISE.get(step.number, "see notes/EXERCISES.md for how to mark one")
        raise UsageError(f"step {step.name} has no exercise regions: {why}")
    if args.region:
        known = {r.name for r in regions}
        unknown = [n for n in args.region if n not in known]
        if unknown:
            raise UsageError(f"step {step.name} has no region {', '.join(unknown)}; its regions "
                             f"are: {', '.join(r.name for r in regions)}")
        regions = [r for r in regions if r.name in args.region]
    root = from_root(args.dir, "--dir")
    dest = root / step.name
    check_exercise_dir(root, dest)
    if dest.exists() and not args.force:
        print(f"error: {rel(dest)} already exists and may hold your work; it was left as it "
              f"is.\nTo start over, run with --force (the old copy is moved to "
              f"{rel(root / '.backup')}/).", file=sys.stderr)
        return EXIT_USAGE
    # Build the whole copy in a fresh folder of our own next to its destination; only then is
    # an old copy moved aside and the new one renamed into place. A failure removes only that
    # fresh folder: no folder this tool did not create is ever moved or deleted, and an old
    # copy is never lost.
    made = pathargs.missing_folders(root)
    work = None
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{step.name}.", dir=root))
        tmp = work / step.name
        try:
            shutil.copytree(step.path, tmp)
        except shutil.Error as e:  # a list of (source, copy, why): the first says enough
            first = e.args[0][0] if e.args and e.args[0] else ("?", "?", str(e))
            more = f" (and {len(e.args[0]) - 1} more)" if len(e.args[0]) > 1 else ""
            m = re.match(r"\[Errno \d+\] (.*?)(?:: '|$)", str(first[2]))
            raise UsageError(f"cannot copy {rel(first[0])} to {rel(dest)}/: "
                             f"{m.group(1) if m else first[2]}{more}; nothing was "
                             "created") from None
        blank_step(step, regions, tmp)
        if dest.exists():
            backup = root / ".backup" / f"{step.name}.{time.strftime('%Y%m%d-%H%M%S')}"
            n = 1
            while backup.exists():  # two resets in one second
                backup = backup.with_name(f"{backup.name.split('~')[0]}~{n}")
                n += 1
            backup.parent.mkdir(parents=True, exist_ok=True)
            os.rename(dest, backup)  # same file system: a rename, never a copy and delete
            try:
                os.rename(tmp, dest)
            except OSError:
                os.rename(backup, dest)  # the old copy back where it was
                raise
            print(f"moved the old copy to {rel(backup)}")
        else:
            os.rename(tmp, dest)
    except OSError as e:
        raise UsageError(f"cannot create {rel(dest)}/: {e.strerror or e}"
                         + (f": {rel(e.filename)}" if e.filename else "") +
                         "; nothing was created") from None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)  # ours: empty after a success
        if not dest.exists():
            for folder in reversed(made):  # the folders this call made for the copy, if empty
                try:
                    folder.rmdir()
                except OSError:
                    break

    opt_dir = "" if args.dir == "exercises" else f"--dir {args.dir}"
    print(f"created {rel(dest)}/ from {rel(step.path)}/ with {len(regions)} region(s) to write:")
    for r in regions:
        print(f"  {r.name:<24} [{r.difficulty or '?'}] "
              f"{rel(dest / r.path.relative_to(step.path))}:{r.begin + 1}")
        if r.concept:
            print(f"  {'':<24} concept: {r.concept}")
    print(f"graded on: {HARDWARE[step_hardware(step)]}: grading this copy needs "
          f"{HARDWARE_NEEDS[step_hardware(step)]}")
    print(f"  (its README.md is an exercise sheet: the step's own README describes the solution)")
    print("next:")
    print("  edit each region: replace LADDER_TODO(...) with your code")
    print(f"  {shell_args('tools/exercise.py grade', step.nn, opt_dir)}"
          "      # build your copy, run its tests: PASS or FAIL")
    print(f"  {shell_args('tools/exercise.py diff', step.nn, opt_dir)}"
          "       # your copy against the solution")
    print(f"  {shell_args('tools/exercise.py create', step.nn, opt_dir, '--force')}"
          "  # start over (keeps a backup)")
    cuda = "" if is_gpu_step(step) else " -DLADDER_ENABLE_CUDA=OFF"
    print(f"  by hand: cmake -S . -B build-exercises -G Ninja -DCMAKE_BUILD_TYPE=Release "
          f"-DLADDER_EXERCISES={rel(root)} -DLADDER_ONLY_STEPS={step.nn}{cuda} && "
          f"cmake --build build-exercises --target {step.name} && "
          f"build-exercises/steps/{step.name}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# export

# What a handout holds, from the repository root: the CMake tree and every layer the grade
# builds or runs (common/ reference/ runner/ steps/ tests/ tools/), the contract, the notes.
# Left out: .git (history), .ci/ (this repository's CI), python/ (the PyTorch binding of the
# solved kernels, no part of a grade), build folders and exercise copies, and the logs in
# notes/results/ (the tuning history, which quotes code; the CSVs stay: the grade's speed
# comparison, figures.py and the notes' tagged numbers read them).
HANDOUT_TOP = ("CMakeLists.txt", "LICENSE", "README.md", ".clang-format", "common", "docs",
               "reference", "runner", "steps", "tests", "tools")
HANDOUT_RESULTS = ("h100.csv", "h200.csv", "ceilings.csv")
# The exercise tests that work from the solutions (the round trip pastes step 02's back and
# plants a mistake in it, naming solution lines; the race test strips the barriers from step
# 05's): they cannot pass on a handout's blank steps, and the round trip quotes solution code.
HANDOUT_OMIT = ("tests/exercise/test_exercise.sh", "tests/exercise/test_race.sh")
HANDOUT_SKIP = re.compile(r"^(build.*|exercises|__pycache__|\.deps|out)$|\.pyc$")


def handout_leaks(folder, solutions):
    """Every text file under `folder` (sources outside steps/ included) with a line that quotes
    a region's solution line: [(path, line, region names)]. Under steps/, the LADDER_TODO
    copies are held to the same rule."""
    out = []
    for f in sorted(folder.rglob("*")):
        if not f.is_file():
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for line, names in leaked_lines(text, solutions):
            out.append((f, line, names))
    return out


def cmd_export(args):
    dest = from_root(args.dir, "DIR")
    r = dest.resolve()
    if r == ROOT.resolve() or r in ROOT.resolve().parents or STEPS.resolve() in (r, *r.parents):
        raise UsageError(f"DIR {args.dir}: is the repository, a folder above it or inside "
                         "steps/; give a new or empty folder of its own")
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"DIR {args.dir}: exists and is not empty; give a new or empty folder "
                         "(a handout is written whole, never over other files)")
    everything = [(s, step_regions(s)) for s in steps()]
    solutions = solution_lines([r for _, regions in everything for r in regions])
    skip = lambda d, names: [n for n in names if HANDOUT_SKIP.search(n) or
                             (Path(d) / n).resolve() == r]
    made = pathargs.missing_folders(dest)
    work = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
        out = work / "handout"
        out.mkdir()
        for top in HANDOUT_TOP:
            src = ROOT / top
            if src.is_dir():
                shutil.copytree(src, out / top, ignore=skip, symlinks=True)
            elif src.is_file():
                shutil.copy2(src, out / top)
        for name in HANDOUT_OMIT:
            (out / name).unlink(missing_ok=True)
        for step, regions in everything:  # every region blanked, the READMEs replaced
            if regions:
                blank_step(step, regions, out / "steps" / step.name)
        (out / "notes" / "results").mkdir(parents=True)
        for md in sorted((ROOT / "notes").glob("*.md")):
            shutil.copy2(md, out / "notes" / md.name)
        for name in HANDOUT_RESULTS:
            if (ROOT / "notes" / "results" / name).is_file():
                shutil.copy2(ROOT / "notes" / "results" / name, out / "notes" / "results" / name)
        # The figures a copied Markdown file shows or links (notes/figures/NAME).
        texts = [f.read_text(encoding="utf-8") for f in out.rglob("*.md")]
        shown = r"figures/([\w.+-]+\.(?:svg|png))"
        figures = sorted({m for t in texts for m in re.findall(shown, t)})
        for name in figures:
            if (ROOT / "notes" / "figures" / name).is_file():
                (out / "notes" / "figures").mkdir(exist_ok=True)
                shutil.copy2(ROOT / "notes" / "figures" / name, out / "notes" / "figures" / name)
        # Text outside steps/ (the notes, EXERCISES.md's marking example) may quote a solution:
        # each such line is replaced, saying whose.
        redacted = []
        for f in sorted(out.rglob("*")):
            if f.is_file() and f.suffix in (".md", ".txt") and "steps" not in \
                    f.relative_to(out).parts[:1]:
                text = f.read_text(encoding="utf-8")
                new, n = redact(text, solutions)
                if n:
                    f.write_text(new, encoding="utf-8")
                    redacted.append(f"{f.relative_to(out)} ({n} line{'s' * (n > 1)})")
        (out / "HANDOUT.md").write_text(handout_readme(figures, redacted), encoding="utf-8")
        leaks = handout_leaks(out, solutions)
        if leaks:
            for f, line, names in leaks[:20]:
                print(f"  {f.relative_to(out)}:{line}: quotes the solution of "
                      f"{', '.join(names)}", file=sys.stderr)
            raise UsageError(f"the handout would give away {len(leaks)} solution line(s) "
                             "(listed above); nothing was written")
        if dest.exists():
            dest.rmdir()  # empty, checked above
        os.rename(out, dest)
    except OSError as e:
        raise UsageError(f"cannot write the handout {args.dir}: {e.strerror or e}"
                         + (f": {rel(e.filename)}" if e.filename else "") +
                         "; nothing was written") from None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        if not dest.exists():
            for folder in reversed(made):
                try:
                    folder.rmdir()
                except OSError:
                    break
    n = sum(len(regions) for _, regions in everything)
    print(f"wrote the handout {args.dir}/: {len([s for s, rg in everything if rg])} steps with "
          f"their {n} regions blanked, the notes, {len(figures)} figures, the harness and the "
          "build; no solution, no history (HANDOUT.md says what was left out)")
    for line in redacted:
        print(f"  redacted a quoted solution line in {line}")
    print(f"a learner: cd {args.dir} && tools/bootstrap.sh && tools/exercise.py create 2 && "
          "tools/exercise.py grade 2")
    return EXIT_OK


def handout_readme(figures, redacted):
    return "\n".join([
        "# This is a handout of the attention ladder", "",
        "Made by `tools/exercise.py export`: every step's exercise regions are blanked to "
        "`LADDER_TODO` in `steps/` itself, and each step's README is an exercise sheet (the "
        "original describes the solution). Work as the README and notes/EXERCISES.md say: "
        "`tools/exercise.py create N` copies a step to `exercises/`, "
        "`tools/exercise.py grade N` grades the copy against the float64 oracle.", "",
        "What is left out, and why:", "",
        "- the solutions: every region's code (no line of it is anywhere in this folder; the "
        "export checks);",
        "- the history: `.git`, the CI scripts (`.ci/`), and the logs of `notes/results/` (the "
        "tuning history, which quotes code): a note's link to one of them leads nowhere here. "
        f"The measurements stay: `notes/results/{'`, `notes/results/'.join(HANDOUT_RESULTS)}`, "
        "which the grade's speed line, `tools/figures.py` and the notes read;",
        "- `python/` (the PyTorch binding of the solved kernels);",
        f"- the exercise tests that work from the solutions ({', '.join(HANDOUT_OMIT)}): the "
        "slow `exercise.roundtrip` and the GPU `exercise.racecheck`, which cannot run here.", "",
        "Since `steps/` is blank, `build/ladder compare` and the `harness.*`, `fault.*` and "
        "`sanitizer.*` tests fail or stop at `not implemented` here, as do the checks that "
        "compare the notes with the full repository (`notes.refs`, `step.readmes`): grade with "
        "`tools/exercise.py grade`, not ctest.", "",
        f"{len(figures)} figures (the ones the notes show)."
        + (" Lines that quoted a solution were replaced in: " + "; ".join(redacted) + "."
           if redacted else ""), ""])


# ---------------------------------------------------------------------------------------------
# grade


def run(cmd, capture=False, echo=True, env=None):
    print("+ " + shlex.join(str(c) for c in cmd), flush=True)
    env = dict(os.environ, **env) if env else None
    if not capture:
        return subprocess.run([str(c) for c in cmd], env=env).returncode, ""
    # Echo as it runs (a cold build takes a while) and keep the text to read the results from.
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace", env=env)
    text = []
    for line in p.stdout:
        if echo:
            sys.stdout.write(line)
        text.append(line)
    sys.stdout.flush()
    return p.wait(), "".join(text)


def cached_settings(build):
    """The CMake cache entries of an existing build folder (name -> value), or {}."""
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return {}
    out = {}
    for line in cache.read_text(encoding="utf-8", errors="replace").splitlines():
        m = re.match(r"^([A-Za-z_][\w-]*):[A-Z]+=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def configure(build, settings):
    """Configures `build` with these cache settings unless it already has them (a configured
    folder re-runs CMake by itself when a CMakeLists.txt changes). Returns (rc, output)."""
    have = cached_settings(build)
    if have and all(have.get(k) == v for k, v in settings.items()) and \
            (build / "build.ninja").is_file():
        print(f"(reusing {rel(build)}: configured with the same settings)")
        return 0, ""
    cmd = ["cmake", "-S", ROOT, "-B", build, "-G", "Ninja"]
    cmd += [f"-D{k}={v}" for k, v in settings.items()]
    return run(cmd, capture=True)


def todo_regions(copy):
    """The regions of an exercise copy still at LADDER_TODO: name -> file:line."""
    out = {}
    for f in source_files(copy):
        for i, line in enumerate(read_lines(f)):
            m = re.search(r'^\s*LADDER_TODO\("([^"]+)"\);', line)
            if m:
                out.setdefault(m.group(1), f"{rel(f)}:{i + 1}")
    return out


@dataclass
class HarnessRun:
    label: str
    status: str  # pass, FAIL, TODO
    detail: list = field(default_factory=list)  # the indented lines after it
    failing: list = field(default_factory=list)  # "O 2.1e-03 > 1.4e-03" for each tensor over


# A verdict line's "NAME err/tol" pairs (tests/harness.cpp).
ERROR_PAIR = re.compile(r"(\S+) ([-+0-9.eE]+|nan|inf)/([-+0-9.eE]+|nan|inf)")


def harness_runs(text):
    """The harness's per-run lines (tests/harness.cpp): `  pass|FAIL|TODO <label> ...` and the
    lines indented under a FAIL or TODO (ctest -V puts `N: ` before each line)."""
    runs = []
    for line in text.splitlines():
        line = re.sub(r"^\d+: ", "", line)
        m = re.match(r"^ {2}(pass|FAIL|TODO) (.*)$", line)
        if m:
            label, _, errors = m.group(2).partition("  ")
            run = HarnessRun(label, m.group(1))
            for name, err, tol in ERROR_PAIR.findall(errors):
                if not float(err) <= float(tol):  # NaN too
                    run.failing.append(f"{name} {err} > {tol}")
            runs.append(run)
            continue
        m = re.match(r"^ {4}((?:wrong result|this case exercises|not implemented): .*)$", line)
        if m and runs and runs[-1].status != "pass":
            runs[-1].detail.append(m.group(1))
    return [r for r in runs if not r.label.startswith("bitwise:")] + \
        [r for r in runs if r.label.startswith("bitwise:")]


def changed_regions(step, copy):
    """The regions whose code in the copy differs from the solution's: where a wrong result of
    a copy can come from (the rest of the copy is the step's own code)."""
    out = []
    for r in step_regions(step):
        mine = copy / r.path.relative_to(step.path)
        try:
            theirs = [x for x in parse_regions(mine) if x.name == r.name]
        except (UsageError, OSError):
            theirs = []
        if not theirs:
            out.append(r.name)  # markers gone or broken: the region cannot be compared
            continue
        a, b = read_lines(r.path), read_lines(mine)
        code = lambda lines, x: [l.strip() for l in lines[x.solution[0]:x.solution[1]] if l.strip()]
        if code(a, r) != code(b, theirs[0]):
            out.append(r.name)
    return out


def grade_report(runs, todo, regions=()):
    """What failed, in the learner's terms: regions not written yet, or wrong results (with
    the regions whose code differs from the solution, and every tensor of the first failing
    run that is over its tolerance)."""
    failed = [r for r in runs if r.status == "FAIL"]
    blank = [r for r in runs if r.status == "TODO"]
    lines = []
    if todo:
        lines.append("not implemented: " + ", ".join(f"'{n}' ({w})" for n, w in todo.items()) +
                     " still LADDER_TODO" + (f"; {len(blank)} of {len(runs)} runs stopped there"
                                             if runs else ""))
    elif blank:  # no LADDER_TODO left, yet runs stopped: a trap (or a throw) of the code itself
        lines.append(f"{len(blank)} of {len(runs)} runs stopped as a blank region would "
                     "(NotImplemented, or a kernel that traps), but no region of the copy is "
                     "still LADDER_TODO: look for a trap or throw in your code")
    if failed:
        first = failed[0]
        where = (f" (your code in region{'s' if len(regions) > 1 else ''} "
                 f"{', '.join(repr(r) for r in regions)})" if regions else "")
        lines.append(f"wrong result in {len(failed)} of {len(runs)} runs{where}; the first: "
                     f"{first.label}")
        if first.failing:
            lines.append(f"  over tolerance: {'; '.join(first.failing)}")
        for d in first.detail:
            lines.append(f"  {d}")
        others = sorted({r.label.split(' ')[0] for r in failed[1:]} - {first.label.split(' ')[0]})
        if others:
            more = f" and {len(others) - 8} more" if len(others) > 8 else ""
            lines.append(f"  other failing cases: {', '.join(others[:8])}{more}")
    return lines


def sanitize(step, build, jobs, verbose):
    """compute-sanitizer's racecheck and synccheck on the copy's program, every variant
    (tests/sanitize.sh with LADDER_SANITIZE_VARIANTS=all): a missing barrier can give right
    numbers on one run and wrong ones on the next, so a GPU grade does not rest on results
    alone. Returns (failed tool lines, not-run reason or "")."""
    rc, _ = run(["cmake", "--build", build, "--target", step.name] + jobs)
    if rc != 0:
        return [f"the step program does not build for the sanitizers (exit status {rc})"], ""
    rc, out = run(["ctest", "--test-dir", build, "-R",
                   rf"^sanitizer\.(racecheck|synccheck)\.{step.nn}_", "-V", "--no-tests=error"],
                  capture=True, echo=verbose, env={"LADDER_SANITIZE_VARIANTS": "all"})
    failed, skipped = [], ""
    for tool in ("racecheck", "synccheck"):
        m = re.search(rf"Test +#\d+: sanitizer\.{tool}\.\S+ \.*\s*(\*\*\*)?(\w+)", out)
        verdict = m.group(2) if m else "missing"
        if verdict == "Skipped":
            why = re.search(r"NOT RUN: (.*)", out)
            skipped = why.group(1) if why else "compute-sanitizer did not run"
        elif verdict != "Passed":
            summary = re.findall(rf"(?:{tool.upper()} SUMMARY|ERROR SUMMARY): .*", out, re.I)
            shape = re.findall(r"^\d+: \+ compute-sanitizer .*? (--seq-q .*?)(?: --backward)? "
                               r"--repeats", out, re.M)
            failed.append(f"sanitizer {tool}: FAIL" +
                          (f" ({summary[0]})" if summary else f" ({verdict})") +
                          (f"; runs: {shape[0]} ..." if shape else ""))
    return failed, skipped


# The one problem a passing copy is timed at, per step: the point notes/COURSE.md quotes the
# solution's speed at (batch x seq = 16384 tokens, heads x dim = 2048 on the GPU, the flash-
# attention shapes of notes/results; on the CPU the problem of results/cpu_log.md). Forward,
# not causal, the step's default variant. The ceiling is the measured peak of that kind of
# arithmetic in notes/results/ceilings.csv.
SPEED_POINT = {  # step: (dtype, batch, heads, seq, dim, ceiling)
    "01": ("fp32", 1, 4, 1024, 64, None), "02": ("fp32", 1, 4, 1024, 64, None),
    "03": ("fp32", 16, 32, 1024, 64, "fp32_ffma"), "04": ("fp32", 16, 32, 1024, 64, "fp32_ffma"),
    "05": ("fp32", 4, 32, 4096, 64, "fp32_ffma"), "06": ("bf16", 4, 32, 4096, 64, "mma_sync_bf16"),
    "07": ("bf16", 4, 32, 4096, 64, "wgmma_bf16"),
}
RESULTS = ROOT / "notes" / "results"


def gpu_name():
    """The first GPU nvidia-smi names, or "" (no nvidia-smi, no driver, no GPU)."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    names = [line.strip() for line in p.stdout.splitlines() if line.strip()]
    return names[0] if p.returncode == 0 and names else ""


def csv_rows(path):
    import csv
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return []


def solution_figure(step, point, gpu):
    """The solution's committed forward TFLOP/s at the grade's point: the newest row (the last
    in the file) of notes/results/h100.csv or h200.csv, of this GPU if it has one, else of any
    GPU. Returns (tflops, gpu, commit, file) or None."""
    dtype, batch, heads, seq, dim, _ = point
    want = {"step": step.nn, "dtype": dtype, "batch": str(batch), "heads": str(heads),
            "heads_kv": str(heads), "seq_q": str(seq), "seq_k": str(seq), "dim": str(dim),
            "causal": "0", "direction": "fwd"}
    found = []
    for name in ("h100.csv", "h200.csv"):
        for row in csv_rows(RESULTS / name):
            if all(row.get(k) == v for k, v in want.items()) and \
                    row.get("dropout", "0") in ("0", "") and row.get("density", "1") in ("1", ""):
                found.append((row, name))
    mine = [x for x in found if x[0].get("gpu") == gpu] or found
    if not mine:
        return None
    row, name = mine[-1]
    try:
        return float(row["tflops"]), row.get("gpu", "?"), row.get("commit", "?"), name
    except (KeyError, ValueError):
        return None


def ceiling(name, gpu):
    """The newest measured ceiling `name` of this GPU (notes/results/ceilings.csv), in TFLOP/s."""
    rows = [r for r in csv_rows(RESULTS / "ceilings.csv")
            if r.get("gpu") == gpu and r.get("ceiling") == name and r.get("unit") == "TFLOP/s"]
    try:
        return (float(rows[-1]["value"]), rows[-1].get("commit", "?")) if rows else None
    except ValueError:
        return None


def report_speed(step, build, jobs, gpu_step, verbose):
    """After a PASS: the copy's default variant timed at the step's point, its TFLOP/s beside
    the measured ceiling of this GPU and the solution's committed figure. The timing run checks
    against the oracle as every run does; a run that fails its check, or cannot run, prints no
    timing. Never changes the verdict."""
    point = SPEED_POINT.get(step.nn)
    if point is None:
        return
    dtype, batch, heads, seq, dim, ceiling_name = point
    shape = f"batch {batch}, heads {heads}, seq {seq}, dim {dim}, {dtype}, forward"
    rc, _ = run(["cmake", "--build", build, "--target", step.name] + jobs, capture=True,
                echo=verbose)
    if rc != 0:
        print(f"speed: not timed (the step program did not build: exit status {rc})")
        return
    rc, out = run([build / "steps" / step.name, "--batch", batch, "--heads", heads, "--seq-q",
                   seq, "--seq-k", seq, "--dim", dim, "--dtype", dtype], capture=True,
                  echo=verbose)
    m = re.search(r"^\s*forward\s+([0-9.eE+-]+) ms\s+([0-9.eE+-]+) TFLOP/s", out, re.M)
    if rc != 0 or not m:
        why = ("its check against the oracle failed at this size" if rc == 1 else
               f"exit status {rc}")
        last = [l for l in out.splitlines() if l.strip()][-1:] or [""]
        print(f"speed: not timed at {shape}: {why} ({last[0].strip()}); no timing is shown "
              "for a run that did not pass")
        return
    # From the time, as the step program counts FLOPs (Problem::fwd_flops, not causal): its
    # printed TFLOP/s has too few digits for a CPU's.
    ms = float(m.group(1))
    tflops = 4.0 * batch * heads * seq * seq * dim / (ms * 1e9) if ms > 0 else float(m.group(2))
    rate = f"{tflops:.4g} TFLOP/s" + (f" ({tflops * 1e3:.3g} GFLOP/s)" if tflops < 0.1 else "")
    print(f"speed: your copy, default variant, at {shape}: {ms:.3f} ms, {rate}")
    gpu = gpu_name() if gpu_step else ""
    if not gpu_step:
        print("  a CPU step: no GPU ceiling applies, and no solution timing is committed for "
              "it (notes/results/cpu_log.md has the solution's CPU times, by hand). The grade "
              "compiles host code at -O1: time in build/ to compare")
        return
    c = ceiling(ceiling_name, gpu) if gpu else None
    if c:
        print(f"  {100 * tflops / c[0]:.1f}% of this GPU's measured {ceiling_name} ceiling, "
              f"{c[0]:.4g} TFLOP/s ({gpu}, notes/results/ceilings.csv, commit {c[1]})")
    else:
        print(f"  no measured {ceiling_name} ceiling for "
              f"{gpu or 'this GPU (nvidia-smi named none)'} in notes/results/ceilings.csv "
              "(tools/ceilings.cu measures one)")
    ref = solution_figure(step, point, gpu)
    if ref:
        other = "" if ref[1] == gpu else ", another GPU than this one"
        print(f"  the solution: {ref[0]:.4g} TFLOP/s at the same point ({ref[1]}{other}; "
              f"notes/results/{ref[3]}, commit {ref[2]})")
    else:
        print("  no committed figure of the solution at this point in notes/results/h100.csv "
              "or h200.csv")


def cmd_grade(args):
    step = find_step(args.step)
    if step.number in NO_EXERCISE and not step_regions(step):
        raise UsageError(NO_EXERCISE[step.number])
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: the number of parallel compile jobs is at least 1")
    ex_dir = from_root(args.dir, "--dir")
    copy = ex_dir / step.name
    check_exercise_dir(ex_dir, copy)
    build = from_root(args.build, "--build")
    check_build_dir(build)
    if not copy.is_dir():
        opt_dir = "" if args.dir == "exercises" else f" --dir {args.dir}"
        raise UsageError(f"no exercise copy {rel(copy)}/: make one with "
                         f"tools/exercise.py create {step.nn}{opt_dir}")
    try:
        build.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--build {rel(build)}: cannot be made: {e.strerror}") from None
    gpu = is_gpu_step(step)
    # Only the graded step is built (LADDER_ONLY_STEPS), a CPU step builds no CUDA at all, and
    # only the harness is built (the step's library with it): the first grade compiles the
    # plumbing, the step and the harness, a later one only the files you changed. Host code is
    # compiled with -O1: a third less compile time, the same harness run time and the same
    # numbers (no fast-math either way). Time rungs in build/, not here.
    settings = {"CMAKE_BUILD_TYPE": "Release", "CMAKE_CXX_FLAGS_RELEASE": "-O1 -DNDEBUG",
                "LADDER_EXERCISES": str(ex_dir), "LADDER_ONLY_STEPS": step.nn,
                "LADDER_ENABLE_CUDA": "ON" if gpu else "OFF"}
    rc, out = configure(build, settings)
    if rc != 0:
        print(f"FAIL: configuring {rel(build)} failed (cmake exit status {rc})")
        return EXIT_FAIL
    ninja = (build / "build.ninja").read_text(encoding="utf-8", errors="replace")
    if f"libstep_{step.nn}.a" not in ninja:
        print(f"NOT RUN: {step.name} is a GPU step and {rel(build)} builds no CUDA rungs (no "
              "CUDA toolkit was found): it can be neither built nor graded here.")
        return EXIT_NOT_RUN
    jobs = ["-j", str(args.jobs)] if args.jobs else []
    # The two largest translation units first, side by side: ninja starts ready jobs in their
    # build.ninja order, which would leave the harness's Catch2 main to compile last, alone.
    first = [o for o in FIRST_OBJECTS if f"build {o}:" in ninja]
    rc = 0
    if first:
        rc, _ = run(["cmake", "--build", build, "--target", *first] + jobs)
    if rc == 0:
        rc, _ = run(["cmake", "--build", build, "--target", "harness"] + jobs)
    if rc != 0:
        print(f"FAIL: your copy does not build (see the compiler's messages above; "
              f"cmake --build exit status {rc})")
        return EXIT_FAIL
    rc, out = run(["ctest", "--test-dir", build, "-R", rf"^harness\.{step.nn}_", "-V",
                   "--no-tests=error"], capture=True, echo=args.verbose)
    runs = harness_runs(out)
    todo = todo_regions(copy)
    # The harness exits 77 without a CUDA device, which ctest counts as skipped, not failed.
    skipped = re.search(r"\*\*\*Skipped|The following tests did not run", out) is not None
    if rc == 0 and skipped:
        print(f"NOT RUN: {step.name} built, but its tests could not run here (no CUDA device); "
              "grade it on a machine with an NVIDIA GPU." +
              (f" Regions still LADDER_TODO: {', '.join(todo)}." if todo else ""))
        return EXIT_NOT_RUN
    by_hand = (f"run your copy by hand: cmake --build {rel(build)} --target {step.name} && "
               f"{rel(build)}/steps/{step.name} --help")
    # On a GPU, racecheck and synccheck as well (not over blank regions: those trap by design).
    races, no_sanitizer = [], ""
    if gpu and not todo and runs:
        races, no_sanitizer = sanitize(step, build, jobs, args.verbose)
        if no_sanitizer:
            print(f"(racecheck and synccheck not run: {no_sanitizer})")
    if rc == 0 and runs and races:
        print(f"FAIL: {step.name} from {rel(copy)}/: every one of {len(runs)} runs of the shared "
              "cases gave the right result, but compute-sanitizer found a hazard:")
        for line in races:
            print(f"  {line}")
        regions = changed_regions(step, copy)
        if regions:
            print(f"  (your code in: {', '.join(regions)}; a barrier missing or misplaced?)")
        print(f"  ({by_hand}; every run: --verbose)")
        return EXIT_FAIL
    if rc == 0 and not runs:  # a grade that ran no case has graded nothing
        print(f"FAIL: {step.name} from {rel(copy)}/: no case of the harness ran (ctest passed, "
              "but printed no per-run verdict), so nothing was graded; rerun with --verbose to "
              "see what ctest ran")
        return EXIT_FAIL
    if rc == 0:
        print(f"PASS: {step.name} from {rel(copy)}/: {len(runs)} runs of the shared cases "
              "against the float64 oracle" +
              (", racecheck and synccheck clean" if gpu and not no_sanitizer else ""))
        if not args.no_timing:
            report_speed(step, build, jobs, gpu, args.verbose)
        return EXIT_OK
    if not args.verbose and not runs:
        sys.stdout.write(out)  # no per-run lines: show what ctest said
    report = grade_report(runs, todo, changed_regions(step, copy)) + races
    print(f"FAIL: {step.name} from {rel(copy)}/ (ctest exit status {rc})")
    for line in report or ["the harness failed without a per-run verdict; rerun with "
                           "--verbose for its whole output"]:
        print(f"  {line}")
    print(f"  ({by_hand}; every run: --verbose)")
    return EXIT_FAIL


# ---------------------------------------------------------------------------------------------
# diff


def cmd_diff(args):
    step = find_step(args.step)
    copy = from_root(args.dir, "--dir") / step.name
    if not copy.is_dir():
        raise UsageError(f"no exercise copy {rel(copy)}/ (make one with tools/exercise.py "
                         f"create {step.nn})")
    names = sorted({p.relative_to(step.path) for p in step.path.rglob("*") if p.is_file()} |
                   {p.relative_to(copy) for p in copy.rglob("*") if p.is_file()})
    # The copy's README.md is the exercise sheet create wrote in place of the step's (which
    # describes the solution): not a change of the learner's.
    sheet = Path("README.md")
    try:
        is_sheet = (copy / sheet).read_text(encoding="utf-8").startswith("# Exercise:")
    except (OSError, UnicodeDecodeError):
        is_sheet = False
    if is_sheet:
        names.remove(sheet)
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
        print(f"{rel(copy)}/ is identical to the solution {rel(step.path)}/" +
              (" (its README.md, the exercise sheet, is not compared)" if is_sheet else ""))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tools/exercise.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = sub.add_parser("list", help="every step and its exercise regions")
    p.add_argument("--markdown", action="store_true", help="as the Markdown table of "
                   "notes/EXERCISES.md")
    p.add_argument("--write", action="store_true", help="refresh that table in "
                   "notes/EXERCISES.md (between its exercises:begin/end markers)")
    p.add_argument("--check", action="store_true", help="exit 1 if the table in "
                   "notes/EXERCISES.md is not the current one")
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
    p.add_argument("--verbose", "-v", action="store_true", help="show the harness's whole "
                   "output, every run")
    p.add_argument("--no-timing", action="store_true", help="after a PASS, do not time the "
                   "copy (by default its default variant is timed at one problem and shown "
                   "beside the GPU's ceiling and the solution's committed figure)")
    p = sub.add_parser("diff", help="unified diff of the exercise copy against the solution")
    p.add_argument("step")
    p.add_argument("--dir", default="exercises")
    p = sub.add_parser("export", help="write a handout: every step blanked, the notes, the "
                       "harness and the build; no solution, no history")
    p.add_argument("dir", metavar="DIR", help="a new or empty folder (relative: from the "
                   "repository root)")
    args = ap.parse_args(argv)
    verbs = {"list": cmd_list, "create": cmd_create, "grade": cmd_grade, "diff": cmd_diff,
             "export": cmd_export}
    try:
        return verbs[args.verb](args)
    except (UsageError, pathargs.PathError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a path that cannot be read or written: said plainly, not a traceback
        print(f"error: {e.strerror or e}" + (f": {e.filename}" if e.filename else ""),
              file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
