#!/usr/bin/env python3
"""Adds the run column to results files written before it existed.

  python3 tools/migrate_results.py FILE...

A results file (docs/CONTRACT.md, "Results files") of the schema without `run` gets the column,
and every row the value `commit:<its commit>`: such rows come from before run ids, when the
commit was the only record of which call measured them, so they pair by commit (two calls at
one commit cannot be told apart). A file already of the current schema is left as it is. The
file is written anew under a temporary name and renamed over the old one: all or nothing.
`ladder bench --csv` and tools/peers.py --csv refuse to append to an unmigrated file.
Exit status: 0 migrated or already current, 2 a file of neither schema, or unreadable.
"""
import argparse
import csv
import io
import os
import sys
import tempfile

BEFORE_RUN = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
              "workspace_bytes,gpu,cuda,commit,dropout,density")
CURRENT = BEFORE_RUN + ",run"


def migrate(path):
    """'migrated N rows', 'already current'; raises ValueError for a file of another schema."""
    with open(path, newline="", encoding="utf-8") as f:
        text = f.read()
    first = text.split("\n", 1)[0].rstrip("\r")
    if first == CURRENT:
        return "already current"
    if first != BEFORE_RUN:
        raise ValueError(f"the header is\n  {first}\nnot the results schema before the run "
                         f"column\n  {BEFORE_RUN}")
    reader = csv.reader(io.StringIO(text))
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
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".migrate-", dir=folder)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            f.write(out.getvalue())
        os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
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
        except (OSError, UnicodeDecodeError, ValueError, csv.Error) as e:
            print(f"migrate_results: {path}: not migrated: {e}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
