#!/usr/bin/env python3
"""The GPT experiment's text: the project's own notes and sources, concatenated.

Every *.md under notes/ and every C++, CUDA and Python source of the repository (.cpp .hpp .h
.cu .cuh .py), in sorted path order, each file followed by a newline. Folders that are not the
project's own text are skipped: hidden ones (.git, .deps), build outputs (build*), out/,
exercises/ (copies of steps) and __pycache__. Nothing is downloaded; the same tree gives the
same corpus, byte for byte (its SHA-256 is printed and logged with each run).

    python3 python/corpus.py                 # statistics
    python3 python/corpus.py --out corpus.txt
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh", ".py"}
SKIP_DIRS = {"out", "exercises", "__pycache__"}


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.startswith("build") or name in SKIP_DIRS


def corpus_files(repo: Path = REPO) -> list[Path]:
    """The files, as paths relative to `repo`, sorted by their POSIX spelling."""
    files = []
    for root, dirs, names in os.walk(repo):
        dirs[:] = [d for d in dirs if not _skipped(d)]
        rel_root = Path(root).relative_to(repo)
        for name in names:
            rel = rel_root / name
            in_notes = rel.parts[:1] == ("notes",)
            if (in_notes and rel.suffix == ".md") or rel.suffix in SOURCE_SUFFIXES:
                files.append(rel)
    return sorted(files, key=lambda p: p.as_posix())


def build_corpus(repo: Path = REPO) -> str:
    parts = []
    for rel in corpus_files(repo):
        parts.append((repo / rel).read_text(encoding="utf-8", errors="replace"))
        parts.append("\n")
    return "".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the corpus to this file")
    args = ap.parse_args()
    text = build_corpus()
    files = corpus_files()
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    print(f"{len(files)} files, {len(text)} characters, {len(set(text))} distinct, sha256 {digest}")
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
