#!/usr/bin/env python3
"""Adds the run column to results files written before it existed.

  python3 tools/migrate_results.py FILE...

A results file (docs/CONTRACT.md, "Results files") of the schema without `run` gets the column,
and every row the value `commit:<its commit>`: such rows come from before run ids, when the
commit was the only record of which call measured them, so they pair by commit (two calls at
one commit cannot be told apart). A file already of the current schema is left as it is. The
file is read and rewritten under an flock of its folder (the lock every results writer takes:
`ladder bench --csv` and tools/peers.py --csv wait for it, and no row they add is lost), written
anew under a temporary name and renamed over the old one: all or nothing. A UTF-8 byte-order
mark before the header is accepted (and not written back).
Paths follow tools/pathargs.py: an empty path, a symbolic link (never replaced by a regular
file), a FIFO, a device or a folder is refused before anything is read.
`ladder bench --csv` and tools/peers.py --csv refuse to append to an unmigrated file.
Exit status: 0 migrated or already current, 2 a file of neither schema, refused or unreadable.
"""
import argparse
import csv
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pathargs  # noqa: E402  (the path-argument rule of every tool)

BEFORE_RUN = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
              "workspace_bytes,gpu,cuda,commit,dropout,density")
CURRENT = BEFORE_RUN + ",run"


def migrate(path):
    """'migrated N rows', 'already current'; raises ValueError for a file of another schema,
    pathargs.PathError for a path the rule refuses."""
    p = pathargs.input_file(path, "FILE")
    with pathargs.folder_lock(p.parent, "FILE"):
        text = pathargs.read_text(p, "FILE")
        first = text.split("\n", 1)[0].rstrip("\r")
        if first == CURRENT:
            return "already current"
        if first != BEFORE_RUN:
            raise ValueError(f"the header is\n  {first}\nnot the results schema before the run "
                             f"column\n  {BEFORE_RUN}")
        reader = csv.reader(io.StringIO(text, newline=""))
        next(reader)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CURRENT.split(","))
        n = 0
        width = len(BEFORE_RUN.split(","))
        commit_at = BEFORE_RUN.split(",").index("commit")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != width:
                raise ValueError(f"line {line} has {len(row)} fields, not {width}")
            writer.writerow(row + [f"commit:{row[commit_at].strip() or '-'}"])
            n += 1
        pathargs.write_atomic(p, out.getvalue(), "FILE")
    return f"migrated {n} rows (run = commit:<commit>)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", metavar="FILE")
    args = ap.parse_args(argv)
    status = 0
    for path in args.files:
        try:
            print(f"migrate_results: {path}: {migrate(path)}")
        except pathargs.PathError as e:
            print(f"migrate_results: error: {e}; not migrated", file=sys.stderr)
            status = 2
        except (OSError, ValueError, csv.Error) as e:
            what = e.strerror if isinstance(e, OSError) and e.strerror else e
            print(f"migrate_results: error: {path}: not migrated: {what}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
