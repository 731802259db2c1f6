#!/usr/bin/env python3
"""notes.refs: every file, line and symbol the notes point at still exists.

Scans notes/*.md, docs/*.md and README.md for
  - Markdown links to repository files, with an optional #L<line> (or #L<a>-L<b>) anchor, and
    links to a heading of another note (#anchor);
  - repository paths in the text (steps/..., common/..., tools/..., `file.cpp`), with an
    optional :<line> or :<a>-<b>;
  - program paths in commands: build/steps/NN_name must name a step folder, and the build
    folder must be one the README sets up (build/, build-gpu/, build-exercises/);
  - a symbol quoted next to a line reference, in either of two forms:
        [`symbol`](../path/file.cpp#L120)      `symbol` (path/file.cpp:120)
    the symbol must occur within a few lines of that line;
  - generated line counts, <!-- lines: path [path ...] -->N<!-- /lines -->: N must be the
    files' total line count (`wc -l`).
A bare file name (`online_softmax.cpp`) must be the name of some file in the repository.

  check_refs.py [ROOT]                 report every broken reference; exit 1 if there is one
  check_refs.py [ROOT] --fix [DOC...]  rewrite the generated line counts (in the DOCs given,
                                       else in every document), then check
"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 and not sys.argv[1].startswith("-") \
    else Path(__file__).resolve().parents[2]
FIX = "--fix" in sys.argv[1:]
FIX_ONLY = {Path(a).resolve() for a in sys.argv[sys.argv.index("--fix") + 1:]} if FIX else set()
NEAR = 4  # how many lines either side of a quoted line the quoted symbol may sit
TOP = r"(?:steps|common|runner|reference|tools|tests|notes|docs|python)"
EXT = r"(?:cpp|hpp|cu|cuh|h|py|sh|md|txt|csv|svg|png|json|cmake)"
BUILD_DIRS = {"build", "build-gpu", "build-exercises"}

LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./@$-])((?:\.\./)*" + TOP + r"/[\w./+-]*[\w/])(?::(\d+)(?:-(\d+))?)?")
BARE = re.compile(r"`([\w.+-]+\." + EXT + r")(?::(\d+)(?:-(\d+))?)?`")
PROG = re.compile(r"(?<![\w./-])(build[\w-]*)/(steps/)?([\w.-]+)")
SYMBOL_NEAR = re.compile(r"`([A-Za-z_][\w:]*)(?:\(\))?`\s*(?:\(|in |at |, )\s*`?((?:\.\./)*"
                         + r"[\w./+-]+\." + EXT + r"):(\d+)(?:-(\d+))?")
PLACEHOLDER = re.compile(r"(?:^|[/_])(?:NN|N|DIR|NAME)(?:$|[/_.])")
LINES = re.compile(r"<!-- lines: ([^>]+?) -->(\d+)<!-- /lines -->")


def repo_files():
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, text=True, check=True)
        return [p for p in out.stdout.splitlines() if p]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for d, dirs, files in os.walk(ROOT):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build")) and x != "exercises"]
            found += [str(Path(d, f).relative_to(ROOT)) for f in files]
        return found


FILES = repo_files()
BASENAMES = {}
for f in FILES:
    BASENAMES.setdefault(Path(f).name, []).append(f)
_line_cache = {}


def lines_of(path):
    if path not in _line_cache:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                _line_cache[path] = f.read().splitlines()
        except OSError:
            _line_cache[path] = None
    return _line_cache[path]


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(md):
    lines = lines_of(md) or []
    seen, out = {}, set()
    fence = False
    for line in lines:
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


class Checker:
    def __init__(self):
        self.errors = []

    def error(self, doc, lineno, msg):
        self.errors.append(f"{doc.relative_to(ROOT)}:{lineno}: {msg}")

    def resolve(self, doc, target):
        """A path as written in doc -> an absolute path, or None when it names no file."""
        target = target.rstrip(".,;:)")
        for base in (doc.parent, ROOT):
            p = (base / target).resolve()
            if p.exists():
                return p
        return None

    def check_line(self, doc, lineno, path, first, last, what):
        text = lines_of(path)
        if text is None:
            return None
        n = len(text)
        first = int(first)
        last = int(last) if last else first
        if first < 1 or last > n or last < first:
            self.error(doc, lineno, f"{what}: line {first}{'-' + str(last) if last != first else ''}"
                       f" is past the end of {path.relative_to(ROOT)} ({n} lines)")
            return None
        return text

    def check_symbol(self, doc, lineno, path, first, last, symbol):
        text = self.check_line(doc, lineno, path, first, last, f"`{symbol}`")
        if text is None:
            return
        name = symbol.split("::")[-1]
        lo = max(0, int(first) - 1 - NEAR)
        hi = min(len(text), int(last or first) + NEAR)
        if not any(re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", l) for l in text[lo:hi]):
            self.error(doc, lineno, f"`{symbol}` is not within {NEAR} lines of "
                       f"{path.relative_to(ROOT)}:{first}")

    def check_doc(self, doc):
        text = lines_of(doc) or []
        for i, line in enumerate(text, 1):
            # Markdown links.
            for m in LINK.finditer(line):
                label, target = m.group(1), m.group(2)
                if re.match(r"^[a-z]+:", target) or target.startswith("<"):
                    continue
                path_part, _, anchor = target.partition("#")
                if not path_part:
                    if anchor and anchor not in anchors(doc):
                        self.error(doc, i, f"link to #{anchor}: no such heading here")
                    continue
                p = self.resolve(doc, path_part)
                if p is None:
                    self.error(doc, i, f"link to {path_part}: no such file")
                    continue
                lm = re.fullmatch(r"L(\d+)(?:-L(\d+))?", anchor or "")
                sym = re.fullmatch(r"`([A-Za-z_][\w:]*)(?:\(\))?`", label.strip())
                if lm and sym:
                    self.check_symbol(doc, i, p, lm.group(1), lm.group(2), sym.group(1))
                elif lm:
                    self.check_line(doc, i, p, lm.group(1), lm.group(2), f"link to {path_part}")
                elif anchor and p.suffix == ".md" and anchor not in anchors(p):
                    self.error(doc, i, f"link to {path_part}#{anchor}: no such heading there")
            # Paths in the text, outside link targets (checked above). A path with a placeholder
            # (steps/NN_name/, DIR) is a pattern, not a reference.
            spans = [m.span(2) for m in LINK.finditer(line)]
            named = {Path(m.group(2).partition("#")[0]).name for m in LINK.finditer(line)}
            for m in PATH.finditer(line):
                path, first, last = m.group(1), m.group(2), m.group(3)
                if any(a <= m.start() < b for a, b in spans) or PLACEHOLDER.search(path):
                    continue
                named.add(Path(path).name)
                p = self.resolve(doc, path)
                if p is None:
                    self.error(doc, i, f"{path}: no such file or folder")
                elif first:
                    self.check_line(doc, i, p, first, last, path)
            for m in BARE.finditer(line):
                name, first, last = m.group(1), m.group(2), m.group(3)
                if name in named or self.resolve(doc, name):
                    continue
                where = BASENAMES.get(name)
                if not where:
                    self.error(doc, i, f"`{name}`: no file of that name in the repository")
                elif first and len(where) == 1:
                    self.check_line(doc, i, ROOT / where[0], first, last, name)
            for m in SYMBOL_NEAR.finditer(line):
                symbol, path, first, last = m.groups()
                p = self.resolve(doc, path)
                if p is None and Path(path).name in BASENAMES and len(BASENAMES[Path(path).name]) == 1:
                    p = ROOT / BASENAMES[Path(path).name][0]
                if p is not None:
                    self.check_symbol(doc, i, p, first, last, symbol)
            # Programs in commands.
            for m in PROG.finditer(line):
                folder, in_steps, name = m.groups()
                name = name.rstrip(".,;:")
                if folder not in BUILD_DIRS:
                    self.error(doc, i, f"{folder}/: not a build folder the README sets up "
                               f"({', '.join(sorted(BUILD_DIRS))})")
                elif in_steps and not PLACEHOLDER.search(name) and \
                        not (ROOT / "steps" / name).is_dir():
                    self.error(doc, i, f"{folder}/steps/{name}: there is no step steps/{name}")
            # Generated line counts.
            for m in LINES.finditer(line):
                paths, n = m.group(1).split(), int(m.group(2))
                total = 0
                for path in paths:
                    content = lines_of(ROOT / path)
                    if content is None:
                        self.error(doc, i, f"line count of {path}: no such file")
                        break
                    total += len(content)
                else:
                    if total != n:
                        self.error(doc, i, f"line count of {' + '.join(paths)} says {n}, "
                                   f"the files have {total} (refresh: {Path(__file__).name} --fix)")

    def fix_counts(self, doc):
        text = doc.read_text(encoding="utf-8")

        def count(m):
            total = sum(len(lines_of(ROOT / p) or []) for p in m.group(1).split())
            return f"<!-- lines: {m.group(1)} -->{total}<!-- /lines -->"

        new = LINES.sub(count, text)
        if new != text:
            doc.write_text(new, encoding="utf-8")
            _line_cache.pop(doc, None)
            print(f"refreshed the line counts in {doc.relative_to(ROOT)}")


def main():
    docs = sorted((ROOT / "notes").glob("*.md")) + sorted((ROOT / "docs").glob("*.md")) + \
        [ROOT / "README.md"]
    c = Checker()
    for doc in docs:
        if FIX and (not FIX_ONLY or doc.resolve() in FIX_ONLY):
            c.fix_counts(doc)
        c.check_doc(doc)
    for e in c.errors:
        print(e)
    print(f"notes.refs: {len(docs)} documents, "
          + (f"{len(c.errors)} broken reference(s)" if c.errors else "every reference holds"))
    return 1 if c.errors else 0


if __name__ == "__main__":
    sys.exit(main())
