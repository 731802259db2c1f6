#!/usr/bin/env python3
"""tools.csv_writers: the Python writers of a results file lose no row when they run at once.

  check_csv_writers.py SOURCE_DIR

tools/peers.py --csv needs PyTorch and a GPU to measure anything, so its writer (ResultsCsv,
which adds each row by tools/pathargs.py merge_csv: an flock of the folder, the file read as it
is, the row added, the whole renamed over it) is driven here directly, from four processes at
once, 60 rows each, into one new file: every row must be there once, the header once, no
temporary left. tools/migrate_results.py runs against the same lock: four migrations of one old
file at once while two writers wait on the folder end with one header, every row migrated once
and every new row kept. Then the writer's path rule: a link, a FIFO, a device and an empty path
are refused before anything is read (a FIFO must not block), and a link is never replaced.
"""
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(SRC / "tools"))
import pathargs  # noqa: E402
import peers  # noqa: E402  (no torch needed: imported in its main())

WRITERS, ROWS = 4, 60


def fields(writer, i):
    return [f"torch-w{writer}", "bf16", 4, 32, 32, 4096, 4096, 64, 0, "fwd", f"{i}.0", "1.0",
            "1.0", 0, "GPU", "13.0", "abc", "0", "1", f"run{writer}"]


def write_rows(path, writer, start):
    start.wait()
    out = peers.ResultsCsv(str(path))
    for i in range(ROWS):
        out.add(fields(writer, i))


def main():
    failures = []

    def expect(what, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + what + (f": {detail}" if detail and not ok else ""))
        if not ok:
            failures.append(what)

    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # Four writers into one new file at once.
        path = tmp / "r.csv"
        start = ctx.Event()
        procs = [ctx.Process(target=write_rows, args=(path, w, start)) for w in range(WRITERS)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(120)
        lines = path.read_text().splitlines()
        want = {",".join(map(str, fields(w, i))) for w in range(WRITERS) for i in range(ROWS)}
        expect("four concurrent peers.py writers: every row once",
               [p.exitcode for p in procs] == [0] * WRITERS and lines[0] == peers.COLUMNS and
               sorted(lines[1:]) == sorted(want),
               f"exit {[p.exitcode for p in procs]}, {len(lines) - 1} rows of {len(want)}, "
               f"{sum(line == peers.COLUMNS for line in lines)} headers")
        expect("no temporary left", sorted(os.listdir(tmp)) == ["r.csv"], sorted(os.listdir(tmp)))

        # Migrations of one old file at once, and writers waiting for the migrated file.
        old = tmp / "old"
        old.mkdir()
        before = peers.COLUMNS_BEFORE_RUN
        rows = [",".join(map(str, fields(9, i)[:-1])) for i in range(200)]
        (old / "h.csv").write_text("\ufeff" + before + "\n" + "\n".join(rows) + "\n")
        tool = SRC / "tools" / "migrate_results.py"
        migs = [subprocess.Popen([sys.executable, str(tool), str(old / "h.csv")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
        outs = [m.communicate(timeout=60) for m in migs]
        text = (old / "h.csv").read_text().splitlines()
        expect("four concurrent migrations: one migrates, three find it current",
               [m.returncode for m in migs] == [0] * 4 and
               sum("migrated 200 rows" in o for o, _ in outs) == 1 and
               text[0] == peers.COLUMNS and len(text) == 201 and
               all(line.endswith(",commit:abc") for line in text[1:]),
               f"{[m.returncode for m in migs]} {[o.strip() for o, _ in outs]} {text[:2]}")
        start = ctx.Event()
        procs = [ctx.Process(target=write_rows, args=(old / "h.csv", w, start)) for w in range(2)]
        for p in procs:
            p.start()
        with pathargs.folder_lock(old, "test"):  # the writers wait for the lock, then add
            start.set()
            time.sleep(0.5)
            held = (old / "h.csv").read_text().count("\n")
        for p in procs:
            p.join(120)
        text = (old / "h.csv").read_text().splitlines()
        expect("writers wait for the folder's lock", held == 201, f"{held} lines while held")
        expect("then add every row", len(text) == 201 + 2 * ROWS and
               [p.exitcode for p in procs] == [0, 0], f"{len(text)} lines")

        # The path rule of the writer and of migrate_results.py.
        (tmp / "target.csv").write_text(peers.COLUMNS + "\n")
        os.symlink("target.csv", tmp / "link.csv")
        os.mkfifo(tmp / "fifo.csv")
        for name, arg in (("a link", tmp / "link.csv"), ("a FIFO", tmp / "fifo.csv"),
                          ("a device", "/dev/null"), ("an empty path", ""),
                          ("a folder", tmp / "old")):
            try:
                peers.ResultsCsv(str(arg))
                ok = False
            except pathargs.PathError:
                ok = True
            expect(f"peers.py --csv refuses {name}", ok)
            t0 = time.time()
            r = subprocess.run([sys.executable, str(tool), str(arg)], capture_output=True,
                               text=True, timeout=60)
            expect(f"migrate_results.py refuses {name}", r.returncode == 2 and
                   "error:" in r.stderr and "Traceback" not in r.stderr and time.time() - t0 < 20,
                   f"exit {r.returncode}: {r.stderr.strip()}")
        expect("the link is still a link", (tmp / "link.csv").is_symlink())
    print(f"tools.csv_writers: {len(failures)} failed" if failures else
          "tools.csv_writers: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
