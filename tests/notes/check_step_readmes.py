#!/usr/bin/env python3
"""step.readmes: every step folder has a README that still tells the truth about the folder.

For every steps/NN_name/:
  - README.md exists;
  - it links every other file of the folder (its reading order leaves none out);
  - every relative link in it points at a file or folder of the repository;
  - every program path build/steps/NN_name in it is this step's own;
  - it has the measured table's markers, and the table between them is what
    `python3 tools/figures.py` writes from the committed results (notes/results/*.csv).

  check_step_readmes.py [ROOT]     report every problem; exit 1 if there is one
"""
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
PROG = re.compile(r"(?<![\w./-])build[\w-]*/steps/([\w.-]+)")


def load_figures():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "tools" / "figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def results(fig):
    """What tools/figures.py's main reads: the results files and the ceilings."""
    folder = ROOT / "notes" / "results"
    files = sorted(p for p in folder.glob("*.csv") if p.name != fig.CEILINGS_FILE and
                   not re.search(r"-trace-\d+$", p.stem))
    files.sort(key=lambda p: (p.stem != "h100", p.stem))
    data = [(p, rows) for p, rows in ((p, fig.load(p)) for p in files) if rows]
    return data, fig.load_ceilings(folder / fig.CEILINGS_FILE)


def main():
    fig = load_figures()
    data, ceilings = results(fig)
    problems = []
    steps = sorted(d for d in (ROOT / "steps").glob("[0-9][0-9]_*") if d.is_dir())
    for step in steps:
        readme = step / "README.md"
        where = readme.relative_to(ROOT).as_posix()
        if not readme.is_file():
            problems.append(f"{step.relative_to(ROOT).as_posix()}: no README.md")
            continue
        text = readme.read_text(encoding="utf-8")
        links = LINK.findall(text)
        targets = set()
        for link in links:
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue
            path = (step / link.split("#")[0]).resolve()
            targets.add(path)
            if not path.exists():
                problems.append(f"{where}: link to {link}, which does not exist")
        for f in sorted(step.iterdir()):
            if f.is_file() and f.name != "README.md" and f.resolve() not in targets:
                problems.append(f"{where}: does not link {f.name} (the reading order lists "
                                "every file of the folder)")
        for name in sorted(set(PROG.findall(text))):
            if name != step.name:
                problems.append(f"{where}: runs build/steps/{name}, not this step's program")
        begin, end = fig.STEP_BEGIN, fig.STEP_END
        if not (begin in text and end in text and text.index(begin) < text.index(end)):
            problems.append(f"{where}: no {begin} ... {end} block for the measured table")
            continue
        body = fig.step_results_block(step.name[:2], step, data, ceilings) if data else None
        if body is not None:
            want = "\n".join(body).rstrip("\n")
            have = text[text.index(begin) + len(begin):text.index(end)].strip("\n")
            if have != want:
                problems.append(f"{where}: the measured table is not what the results say; "
                                "run python3 tools/figures.py")
    for p in problems:
        print(f"step.readmes: {p}")
    if problems:
        return 1
    print(f"step.readmes: {len(steps)} step READMEs, every one complete and current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
