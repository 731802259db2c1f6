#!/usr/bin/env python3
"""Bad input never crashes, never lies, never writes: the malformed-input corpus.

  check_corpus.py STEP_BIN_DIR LADDER_BINARY

Generates, in a temporary folder, one case per class of bad input (broken .npy files, wrong
shapes and dtypes, non-finite values, missing and non-regular files, bad block masks, sizes
that overflow or exceed the machine, flags out of range), runs a step program or the `ladder`
driver on each, and checks that every case exits 2 with an "error:" message on stderr, does
not crash, and leaves the --save folder without a single file. A few valid controls must
exit 0, so that the corpus cannot pass by refusing everything.

Every case also runs between two snapshots of the whole temporary folder (each path's type,
size, link target, and the bytes of files up to 1 MiB): a case that fails may change nothing
in it, and a case that succeeds only the outputs it names. The second pass (issue #22,
second_pass()) adds the reproducers of tools that destroyed data, failed runs that overwrote
outputs, checks in the wrong order, silent defaults, lenient parsing and unbounded reads, each
with its exit status. The third pass of the tools (issue #36, third_pass_tools()) holds the Python
tools and scripts under tools/ to their one path rule (tools/pathargs.py): empty paths, links,
FIFOs and devices refused at once, outputs all or none, no step README of another tree
rewritten, one-line errors; the tools that write into the repository run from a copy of it in
the temporary folder. Needs only the standard library (matplotlib where present, for the
figures' own cases).
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

BIN, LADDER = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
# The programs stamp results with $LADDER_COMMIT, else ask git about the source tree: a case
# that kills a program at every step must not kill a git inside the repository (a stale
# index.lock there would stop the user's next commit).
os.environ["LADDER_COMMIT"] = "corpus"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = os.path.join(BIN, "02_online_softmax")   # CPU, fp32, masks and dropout
ORACLE = os.path.join(BIN, "00_cpu_reference")  # float64


def npy(shape, values=None, descr="<f4", fortran=False, version=1, magic=b"\x93NUMPY"):
    """The bytes of a .npy file (values default to a ramp that is finite everywhere)."""
    n = 1
    for s in shape:
        n *= s
    shape_txt = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shape_txt)
    pre = len(magic) + 2 + (2 if version == 1 else 4)
    header += " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    head = magic + bytes([version, 0])
    head += struct.pack("<H" if version == 1 else "<I", len(header))
    if values is None:
        values = [((i % 7) - 3) * 0.25 for i in range(n)]
    fmt = {"<f4": "<%df", "<f8": "<%dd", ">f4": ">%df", "<i4": "<%di", "|u1": "<%dB",
           "|b1": "<%dB", "<c8": "<%dd"}[descr]
    count = n * (2 if descr == "<c8" else 1)
    vals = list(values) + [0] * (count - len(values))
    return head + header.encode() + struct.pack(fmt % count, *vals[:count])


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


SHAPE_Q, SHAPE_KV = (1, 2, 17, 8), (1, 2, 23, 8)


def inputs(root, **override):
    """A --load folder: good q, k, v files unless a name is overridden (None: left out)."""
    os.makedirs(root, exist_ok=True)
    files = {"q.npy": npy(SHAPE_Q), "k.npy": npy(SHAPE_KV), "v.npy": npy(SHAPE_KV)}
    files.update(override)
    for name, data in files.items():
        if data is not None:
            write(os.path.join(root, name), data)
    return root


def limited_run(argv, fsize):
    """Runs argv with writes past `fsize` bytes failing (EFBIG), as on a full disk."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, preexec_fn=limit)


def integrity(tmp, good):
    """Data integrity: results files and saves are all or nothing; only own files are deleted."""
    fails = 0

    def check(name, ok, detail=""):
        nonlocal fails
        print(("ok   " if ok else "FAIL ") + "%-28s %s" % (name, detail))
        fails += not ok

    # ladder bench --csv on a "full disk": exit 2, the old file byte for byte as it was, no
    # temporary left behind.
    folder = os.path.join(tmp, "csv_full")
    os.mkdir(folder)
    csv = os.path.join(folder, "results.csv")
    header = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
              "workspace_bytes,gpu,cuda,commit,dropout,density,run\n")
    old = header + "02,fp32,1,2,2,64,64,64,0,fwd,1,1,1,0,cpu,-,abc,0,1,r1\n"
    write(csv, old.encode())
    bench = [LADDER, "bench", "--steps", "2", "--seqlens", "64", "--causal", "0", "--directions",
             "fwd", "--repeats", "1", "--csv", csv]
    r = limited_run(bench, len(old) + 40)
    left = sorted(os.listdir(folder))
    check("csv_full_disk", r.returncode == 2 and open(csv).read() == old and left == ["results.csv"],
          "exit %s, files %s, stderr %s" % (r.returncode, left, r.stderr.strip()[-120:]))
    r = subprocess.run(bench, capture_output=True, text=True, timeout=300)
    rows = open(csv).read().splitlines()
    check("csv_appends", r.returncode == 0 and rows[:2] == old.splitlines() and len(rows) == 3,
          "exit %s, %d lines" % (r.returncode, len(rows)))

    # --json on a full disk leaves no x.json.tmp (or any temporary) behind.
    jfolder = os.path.join(tmp, "json_full")
    os.mkdir(jfolder)
    r = limited_run([LADDER, "bench", "--steps", "2", "--seqlens", "64", "--causal", "0",
                     "--directions", "fwd", "--repeats", "1", "--json",
                     os.path.join(jfolder, "x.json")], 20)
    check("json_full_disk", r.returncode == 2 and os.listdir(jfolder) == [],
          "exit %s, files %s" % (r.returncode, os.listdir(jfolder)))

    # A forward-only --save into a folder holding a backward run's files: afterwards exactly
    # o.npy and lse.npy; a pre-existing folder named like the old temporaries is left alone.
    out = os.path.join(tmp, "save_stale")
    r1 = subprocess.run([ORACLE, "--load", inputs(os.path.join(tmp, "with_do"),
                                                   **{"do.npy": npy(SHAPE_Q)}),
                         "--backward", "--save", out], capture_output=True, text=True)
    os.mkdir(os.path.join(out, ".o.npy.partial"))
    write(os.path.join(out, "notes.txt"), b"mine")
    r2 = subprocess.run([ORACLE, "--load", good, "--save", out], capture_output=True, text=True)
    check("save_removes_stale", r1.returncode == 0 and r2.returncode == 0 and
          sorted(os.listdir(out)) == [".o.npy.partial", "lse.npy", "notes.txt", "o.npy"],
          "files %s" % sorted(os.listdir(out)))

    # A save that cannot complete (o.npy is a folder) writes nothing and keeps what was there.
    out = os.path.join(tmp, "save_blocked")
    os.makedirs(os.path.join(out, "o.npy"))
    write(os.path.join(out, "lse.npy"), b"old")
    r = subprocess.run([STEP, "--load", good, "--save", out], capture_output=True, text=True)
    check("save_all_or_nothing", r.returncode == 2 and open(os.path.join(out, "lse.npy")).read() ==
          "old" and sorted(os.listdir(out)) == ["lse.npy", "o.npy"],
          "exit %s, files %s" % (r.returncode, sorted(os.listdir(out))))

    # ladder compare --save: when one step's folder cannot be written, no step's folder is.
    out = os.path.join(tmp, "compare_save")
    os.makedirs(os.path.join(out, "02_online_softmax", "lse.npy"))
    r = subprocess.run([LADDER, "compare", "--steps", "0,1,2", "--seq-q", "9", "--seq-k", "9",
                        "--save", out], capture_output=True, text=True)
    check("compare_save_all_or_nothing", r.returncode == 2 and sorted(os.listdir(out)) ==
          ["02_online_softmax"] and os.listdir(os.path.join(out, "02_online_softmax")) == ["lse.npy"],
          "exit %s, %s" % (r.returncode, sorted(os.listdir(out))))
    return fails


def snapshot(root):
    """Every path under root: (type, size, link target or the bytes of a file up to 1 MiB, or
    for a larger file its modification time). FIFOs and devices are stat()ed, never opened."""
    import hashlib
    import stat
    snap = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                snap[path] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                if st.st_size <= 1 << 20:
                    with open(path, "rb") as f:
                        snap[path] = ("file", hashlib.sha1(f.read()).hexdigest())
                else:
                    snap[path] = ("file", st.st_size, st.st_mtime_ns)
            else:
                snap[path] = (stat.S_IFMT(st.st_mode),)
    return snap


def changes(before, after, allowed=()):
    """Paths that changed, appeared or vanished, except under the `allowed` paths."""
    def mine(p):
        return any(p == a or p.startswith(a.rstrip(os.sep) + os.sep) for a in allowed)
    return sorted(p for p in set(before) | set(after)
                  if before.get(p) != after.get(p) and not mine(p))


def raw_npy(header, data=b"", declared=None):
    """A version-1 .npy with the header text as given (padded to 64 bytes, newline last)."""
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def built_gpu_steps():
    """The GPU rungs this build has (their programs exist); on this machine they exit 3 for
    want of a device, so every bad-input case on them must exit 2 first."""
    return {n for n in ("03_naive_cuda", "04_thread_per_row", "05_shared_memory_fa2",
                        "06_tensor_core_fa2", "07_wgmma_tma_fa3")
            if os.path.exists(os.path.join(BIN, n))}


def second_pass(tmp, good):
    """Issue #22's reproducers: (name, argv, expected exit, outputs it may change, cwd,
    a check afterwards returning an error text or "")."""
    cases = []
    sp = os.path.join(tmp, "second")
    os.makedirs(sp)

    def case(name, argv, want, allowed=(), cwd=None, after=None):
        cases.append((name, argv, want, allowed, cwd, after))

    step = lambda n: os.path.join(BIN, n)
    S01, S02 = step("01_three_pass_softmax"), step("02_online_softmax")
    tiny_bench = [LADDER, "bench", "--steps", "2", "--seqlens", "32", "--dims", "8", "--causal",
                  "0", "--directions", "fwd", "--repeats", "1", "--warmup", "0"]
    header = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
              "workspace_bytes,gpu,cuda,commit,dropout,density\n")

    # --- tools that destroyed data: FIFOs, links, folders and one file named twice
    w = os.path.join(sp, "outputs")
    os.makedirs(w)
    os.mkfifo(os.path.join(w, "fifo"))
    write(os.path.join(w, "real.csv"), header.encode())
    os.symlink("real.csv", os.path.join(w, "link.csv"))
    write(os.path.join(w, "r.csv"), (header + "02,fp32,1,1,1,8,8,8,0,fwd,1,1,1,0,cpu,-,x,0,1\n")
          .encode())
    os.mkdir(os.path.join(w, "adir"))
    case("bench_json_fifo", tiny_bench + ["--json", "fifo"], 2, cwd=w)
    case("bench_csv_fifo", tiny_bench + ["--csv", "fifo"], 2, cwd=w)
    case("bench_csv_symlink", tiny_bench + ["--csv", "link.csv"], 2, cwd=w)
    case("bench_json_symlink", tiny_bench + ["--json", "link.csv"], 2, cwd=w)
    case("bench_json_folder", tiny_bench + ["--json", "adir"], 2, cwd=w)
    case("bench_csv_json_same", tiny_bench + ["--csv", "r.csv", "--json", "r.csv"], 2, cwd=w)
    case("bench_csv_json_same_spelled", tiny_bench + ["--csv", "r.csv", "--json", "./adir/../r.csv"],
         2, cwd=w)
    case("compare_csv_fifo", [LADDER, "compare", "--steps", "1", "--seq-q", "8", "--seq-k", "8",
                              "--csv", "fifo"], 2, cwd=w)
    case("control_bench_csv_json", tiny_bench + ["--csv", "new.csv", "--json", "new.json"], 0,
         allowed=[os.path.join(w, "new.csv"), os.path.join(w, "new.json")], cwd=w,
         after=lambda: "" if open(os.path.join(w, "new.json")).read().startswith("[") and
         open(os.path.join(w, "new.csv")).read().startswith("step,") else "outputs not written")

    # figures.py: a typo in --results, a --readme that is not Markdown, neither rewritten
    fig = os.path.join(REPO, "tools", "figures.py")
    fd = os.path.join(sp, "figures")
    os.makedirs(os.path.join(fd, "results"))
    write(os.path.join(fd, "README.md"), b"# x\n\n<!-- results:begin -->\nkept\n<!-- results:end -->\n")
    write(os.path.join(fd, "results.csv"), header.encode())
    py = sys.executable
    case("figures_results_typo", [py, fig, "--results", os.path.join(fd, "result"), "--readme",
                                  os.path.join(fd, "README.md"), "--figures",
                                  os.path.join(fd, "figs")], 2)
    case("figures_readme_csv", [py, fig, "--results", os.path.join(fd, "results"), "--readme",
                                os.path.join(fd, "results.csv"), "--figures",
                                os.path.join(fd, "figs")], 2)
    os.makedirs(os.path.join(fd, "broken"))
    write(os.path.join(fd, "broken", "h100.csv"), (header + "02,fp32,x\n").encode())
    case("figures_no_usable_row", [py, fig, "--results", os.path.join(fd, "broken"), "--readme",
                                   os.path.join(fd, "README.md"), "--figures",
                                   os.path.join(fd, "figs")], 2)
    case("figures_readme_missing", [py, fig, "--results", os.path.join(fd, "results"),
                                    "--readme", os.path.join(fd, "READ.md"), "--figures",
                                    os.path.join(fd, "figs")], 2)

    # exercise.py create --dir steps --force, on a copy of the tools and steps (never on this
    # checkout): exit 2, and the copy's steps/ exactly as it was.
    ex = os.path.join(sp, "repo")
    shutil.copytree(os.path.join(REPO, "steps"), os.path.join(ex, "steps"))
    os.makedirs(os.path.join(ex, "tools"))
    for t in ("exercise.py", "pathargs.py"):  # the tool and the path rule it imports
        shutil.copy(os.path.join(REPO, "tools", t), os.path.join(ex, "tools"))
    exercise = [py, os.path.join(ex, "tools", "exercise.py")]
    case("exercise_dir_steps_force", exercise + ["create", "2", "--dir", "steps", "--force"], 2)
    case("exercise_dir_above_steps", exercise + ["create", "2", "--dir", ".", "--force"], 0,
         allowed=[os.path.join(ex, "02_online_softmax")])
    case("exercise_dir_is_file", exercise + ["create", "2", "--dir",
                                             os.path.join(ex, "tools", "exercise.py")], 2)
    exd = os.path.join(sp, "exercises")
    case("control_exercise_create", exercise + ["create", "2", "--dir", exd], 0, allowed=[exd])
    case("exercise_force_keeps_backup", exercise + ["create", "2", "--dir", exd, "--force"], 0,
         allowed=[exd], after=lambda: "" if len(os.listdir(os.path.join(exd, ".backup"))) == 1 and
         os.path.isdir(os.path.join(exd, "02_online_softmax")) and
         not [n for n in os.listdir(exd) if n.startswith(".02")] else
         "exercises/: %s" % sorted(os.listdir(exd)))

    # ladder compare --save D: a step folder of an earlier comparison loses its outputs (the
    # folder and other files stay); this run's folders hold its outputs.
    cd = os.path.join(sp, "compare_save")
    os.makedirs(os.path.join(cd, "02_online_softmax"))
    write(os.path.join(cd, "02_online_softmax", "o.npy"), b"earlier")
    write(os.path.join(cd, "02_online_softmax", "mine.txt"), b"mine")
    write(os.path.join(cd, "notes.txt"), b"mine")
    case("compare_save_clears_earlier_steps",
         [LADDER, "compare", "--steps", "0,1", "--seq-q", "9", "--seq-k", "9", "--save", cd], 0,
         allowed=[os.path.join(cd, n) for n in ("00_cpu_reference", "01_three_pass_softmax")] +
         [os.path.join(cd, "02_online_softmax", "o.npy")],
         after=lambda: "" if os.listdir(os.path.join(cd, "02_online_softmax")) == ["mine.txt"] and
         sorted(os.listdir(os.path.join(cd, "01_three_pass_softmax"))) == ["lse.npy", "o.npy"]
         else "folders: %s" % [(d, sorted(os.listdir(os.path.join(cd, d)))) for d in
                               os.listdir(cd) if os.path.isdir(os.path.join(cd, d))])

    # --- a failed run writes nothing; inputs that would overflow are refused on every rung
    out = os.path.join(sp, "failed_save")
    os.makedirs(out)
    write(os.path.join(out, "o.npy"), b"good")
    write(os.path.join(out, "lse.npy"), b"good")
    case("failed_check_keeps_save", [S01, "--variant", "unsafe", "--inputs", "large", "--save",
                                     out], 1)
    huge_v = inputs(os.path.join(sp, "v_3e38"), **{"v.npy": npy(SHAPE_KV, values=[3e38] * 368)})
    for n in ("01_three_pass_softmax", "02_online_softmax"):
        case("v_3e38_" + n[:2], [step(n), "--load", huge_v, "--save", os.path.join(sp, "o3e38")], 2)
    case("v_3e38_compare", [LADDER, "compare", "--steps", "1,2", "--load", huge_v], 2)
    big_qk = inputs(os.path.join(sp, "qk_1e20"), **{"q.npy": npy(SHAPE_Q, values=[1e20] * 272),
                                                    "k.npy": npy(SHAPE_KV, values=[1e20] * 368)})
    case("scores_overflow_fp32", [S01, "--load", big_qk], 2)
    case("control_v_1e30", [S02, "--load", inputs(os.path.join(sp, "v_1e30"), **{
        "v.npy": npy(SHAPE_KV, values=[1e30] * 368)})], 0)
    case("control_v_3e38_fp64", [step("00_cpu_reference"), "--load", huge_v], 0)

    # --- checks in the wrong order: bad input is exit 2 before any device is asked for
    nan_dir = inputs(os.path.join(sp, "nan"), **{"q.npy": npy(SHAPE_Q, values=[float("nan")])})
    gpu = built_gpu_steps()
    order_cases = [
        ("06_tensor_core_fa2", ["--dim", "64", "--block-sparsity", "random:0.5", "--mask-block",
                                "64"]),
        ("05_shared_memory_fa2", ["--block-sparsity", "random:0.5", "--mask-block", "100"]),
        ("03_naive_cuda", ["--load", nan_dir]),
        ("04_thread_per_row", ["--load", huge_v]),
        ("03_naive_cuda", ["--dtype", "fp8"]),
        ("07_wgmma_tma_fa3", ["--dim", "17"]),
    ]
    skipped = []
    for n, argv in order_cases:
        if n in gpu:
            case("order_" + n[:2] + "_" + argv[0].strip("-"), [step(n)] + argv, 2)
        else:
            skipped.append(n)
    if "04_thread_per_row" in gpu:
        case("order_compare_dim_17", [LADDER, "compare", "--steps", "4", "--dim", "17"], 2)
    else:
        skipped.append("ladder compare --steps 4")
    if skipped:
        print("note: not built here, so not asserted: " + ", ".join(sorted(set(skipped))))

    # --- silent defaults and lenient parsing
    for flag in ("--load", "--save", "--block-mask", "--block-sparsity", "--mask-block",
                 "--dtype", "--variant", "--inputs", "--check"):
        case("empty" + flag.replace("-", "_"), [S02, flag, ""], 2)
    case("save_f64_without_save", [S02, "--save-f64"], 2)
    for name, argv in {"seed_space_minus_one": ["--seed", " -1"], "seed_minus_one": ["--seed", "-1"],
                       "seed_trailing_space": ["--seed", "1 "], "batch_space": ["--batch", " 2"],
                       "dropout_space": ["--dropout", " 0.1"], "repeats_suffix": ["--repeats", "3x"],
                       "seq_plus_hex": ["--seq-q", "0x10"], "mask_block_space": [
                           "--block-sparsity", "local:1", "--mask-block", " 64"],
                       "sparsity_rho_space": ["--block-sparsity", "random: 0.5"],
                       "dtype_space": ["--dtype", "fp32 "]}.items():
        case(name, [S02] + argv, 2)
    for name, argv in {"repeats_0": ["--repeats", "0"], "repeats_minus_1": ["--repeats", "-1"],
                       "warmup_minus_5": ["--warmup", "-5"], "tokens_0": ["--tokens", "0"],
                       "hidden_0": ["--hidden", "0"], "seqlens_empty": ["--seqlens", ""],
                       "csv_empty": ["--csv", ""], "json_empty": ["--json", ""],
                       "seed_negative": ["--seed", "-1"], "causal_2": ["--causal", "2"],
                       "steps_empty": ["--steps", ""]}.items():
        case("bench_" + name, tiny_bench + argv, 2)
    case("compare_steps_empty", [LADDER, "compare", "--steps", ""], 2)
    case("diff_tol_space", [LADDER, "diff", os.path.join(good, "k.npy"),
                            os.path.join(good, "v.npy"), "--tol", " 1"], 2)

    # the .npy header grammar
    body = struct.pack("<272f", *([0.5] * 272))
    for name, hdr in {
            "fortran_order_1": "{'descr': '<f4', 'fortran_order': 1, 'shape': (1, 2, 17, 8), }",
            "fortran_order_maybe": "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1, 2, 17, 8), }",
            "shape_double_comma": "{'descr': '<f4', 'fortran_order': False, 'shape': (1,, 2, 17, 8), }",
            "no_braces": "'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 17, 8),",
            "descr_inside_key": "{'fortran_order': False, 'shape': (1, 2, 17, 8), "
                                "'x': \"'descr': '<f4'\"}",
            "unknown_key": "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 17, 8), "
                           "'extra': 1}",
            "duplicate_key": "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                             "'shape': (1, 2, 17, 8)}",
            "text_after_dict": "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 17, 8)} x",
            "shape_negative": "{'descr': '<f4', 'fortran_order': False, 'shape': (1, -2, 17, 8)}",
            "shape_not_tuple": "{'descr': '<f4', 'fortran_order': False, 'shape': [1, 2, 17, 8]}",
            "missing_shape": "{'descr': '<f4', 'fortran_order': False}",
            "descr_padded": "{'descr': '<f4 ', 'fortran_order': False, 'shape': (1, 2, 17, 8)}",
    }.items():
        d = inputs(os.path.join(sp, "hdr_" + name), **{"q.npy": raw_npy(hdr, body)})
        case("npy_" + name, [S02, "--load", d], 2)
    case("npy_one_element_no_comma", [LADDER, "diff", os.path.join(sp, "one.npy"),
                                      os.path.join(sp, "one.npy")], 2)
    write(os.path.join(sp, "one.npy"), raw_npy("{'descr': '<f4', 'fortran_order': False, "
                                               "'shape': (3)}", struct.pack("<3f", 1, 2, 3)))
    write(os.path.join(sp, "one_ok.npy"), raw_npy("{\"descr\":\"<f4\",\"fortran_order\":False,"
                                                  "\"shape\":(3,)}", struct.pack("<3f", 1, 2, 3)))
    case("control_npy_compact_header", [LADDER, "diff", os.path.join(sp, "one_ok.npy"),
                                        os.path.join(sp, "one_ok.npy"), "--tol", "0"], 0)

    # --- resources: sizes checked against the headers before any data is read (sparse files:
    # no disk is used)
    big_mask = os.path.join(sp, "mask_400M.npy")
    with open(big_mask, "wb") as f:
        f.write(raw_npy("{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 20000, 20000), }"))
        f.truncate(f.tell() + 20000 * 20000)
    case("mask_400M_entries_refused_fast", [S02, "--seq-q", "16", "--seq-k", "16", "--block-mask",
                                            big_mask, "--mask-block", "16"], 2)
    big = os.path.join(sp, "big_12G.npy")
    with open(big, "wb") as f:
        f.write(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3000000000,), }"))
        f.truncate(f.tell() + 4 * 3000000000)
    case("diff_12G_shapes_first", [LADDER, "diff", big, os.path.join(good, "k.npy")], 2)
    blocked = os.path.join(sp, "save_dq_dir")
    os.makedirs(os.path.join(blocked, "dq.npy"))
    case("save_stale_name_is_folder", [S02, "--seq-q", "8", "--seq-k", "8", "--save", blocked], 2)
    linked = os.path.join(sp, "save_o_link")
    os.makedirs(linked)
    os.symlink(os.path.join(sp, "nowhere"), os.path.join(linked, "o.npy"))
    case("save_output_is_symlink", [S02, "--seq-q", "8", "--seq-k", "8", "--save", linked], 2)
    return cases


def third_pass_tools(tmp):
    """Issue #36's reproducers for the Python tools and scripts under tools/ (pathargs.py's one
    rule): empty paths, links, FIFOs and devices refused before any read or write; figures.py
    publishing every output or none, and never the step READMEs of another tree; the results
    CSV writers refusing links; exercise.py refusing build folders it must not reconfigure;
    bar_table.py, stalls.py and alternate.sh saying what is wrong (exit 2, one line). The tools
    that would write into the repository run from a copy of it in tmp, so the snapshot sees
    them. Same case tuples as second_pass()."""
    import gzip
    cases = []
    tp = os.path.join(tmp, "third")
    os.makedirs(tp)
    py = sys.executable

    def case(name, argv, want, allowed=(), cwd=None, after=None):
        cases.append((name, argv, want, allowed, cwd, after))

    def full_disk(limit, argv):
        """argv run with writes past `limit` bytes failing (EFBIG), as on a full disk."""
        return [py, "-c", "import os, resource, signal, sys; "
                "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); n = int(sys.argv[1]); "
                "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
                "os.execv(sys.argv[2], sys.argv[2:])", str(limit)] + argv

    def one_line(out, err):
        return "" if len(err.strip().splitlines()) == 1 and "[(" not in err else \
            "not a one-line error: %r" % err[-300:]

    header = ("step,dtype,batch,heads,heads_kv,seq_q,seq_k,dim,causal,direction,ms,tflops,gbps,"
              "workspace_bytes,gpu,cuda,commit,dropout,density,run\n")
    row05 = "05,fp32,4,32,32,4096,4096,64,0,fwd,16.3,33.6,32.8,2097152,%s,13.0,abc,0,1,r1\n"

    # A copy of the tools and of the step READMEs: the "repository" these runs may damage.
    repo = os.path.join(tp, "repo")
    os.makedirs(os.path.join(repo, "tools"))
    for t in ("figures.py", "pathargs.py", "exercise.py", "peers.py", "migrate_results.py",
              "alternate.sh"):
        shutil.copy(os.path.join(REPO, "tools", t), os.path.join(repo, "tools"))
    shutil.copytree(os.path.join(REPO, "steps"), os.path.join(repo, "steps"))
    write(os.path.join(repo, "README.md"),
          b"# copy\n\n## Results\n\n<!-- results:begin -->\nkept\n<!-- results:end -->\n")
    fig = os.path.join(repo, "tools", "figures.py")
    readme = os.path.join(tp, "R.md")
    write(readme, b"# x\n\n<!-- results:begin -->\nkept\n<!-- results:end -->\n")
    empty = os.path.join(tp, "empty")
    os.makedirs(empty)
    step_readme = os.path.join(repo, "steps", "05_shared_memory_fa2", "README.md")

    # --- figures.py: "" is not ".", a README elsewhere never rewrites the tree's step READMEs
    case("figures_results_empty_path", [py, fig, "--results", ""], 2)
    case("figures_figures_empty_path", [py, fig, "--results", empty, "--figures", ""], 2)
    case("figures_readme_elsewhere_keeps_steps", [py, fig, "--results", empty, "--readme", readme,
                                                  "--figures", os.path.join(tp, "fig")], 0,
         allowed=[readme])
    # a failure writes nothing: a full disk (the README and the step READMEs all or none)
    case("figures_full_disk_writes_nothing",
         full_disk(200, [py, fig, "--results", empty, "--figures", os.path.join(tp, "fig")]), 2)
    case("control_figures_steps_follow_readme", [py, fig, "--results", empty], 0,
         allowed=[os.path.join(repo, "README.md"), os.path.join(repo, "steps")],
         after=lambda: "" if "No results yet" in open(step_readme).read() else
         "the step READMEs of the repository's README were not regenerated")
    # readers: a FIFO or a link to /dev/zero in --results refused at once, not read
    fifo_res = os.path.join(tp, "fifo_results")
    os.makedirs(fifo_res)
    os.mkfifo(os.path.join(fifo_res, "h100.csv"))
    case("figures_fifo_in_results", [py, fig, "--results", fifo_res, "--readme", readme,
                                     "--figures", os.path.join(tp, "fig")], 2)
    zero_res = os.path.join(tp, "zero_results")
    os.makedirs(zero_res)
    os.symlink("/dev/zero", os.path.join(zero_res, "h100.csv"))
    case("figures_dev_zero_link_in_results", [py, fig, "--results", zero_res, "--readme",
                                              readme, "--figures", os.path.join(tp, "fig")], 2)
    os.symlink("R.md", os.path.join(tp, "R_link.md"))
    case("figures_readme_link", [py, fig, "--results", empty, "--readme",
                                 os.path.join(tp, "R_link.md"), "--figures",
                                 os.path.join(tp, "fig")], 2)
    seq0 = os.path.join(tp, "seq0")
    os.makedirs(seq0)
    write(os.path.join(seq0, "h100.csv"), (header + (row05 % "GPU").replace(
        ",4096,4096,", ",0,4096,")).encode())
    # a row with seq 0 is skipped (no division by zero), a file of nothing else refused
    case("figures_seq_0_writes_nothing", [py, fig, "--results", seq0, "--figures",
                                          os.path.join(tp, "fig")], 2)
    # with matplotlib: no figure written through a link, a failed figure publishes nothing, and
    # CSV text is escaped in the README's table
    def has_matplotlib():
        return any(subprocess.run([p, "-c", "import matplotlib"], capture_output=True)
                   .returncode == 0 for p in (py, "/usr/bin/python3") if os.path.exists(p))
    if has_matplotlib():
        good = os.path.join(tp, "good")
        os.makedirs(good)
        write(os.path.join(good, "h100.csv"), (header + row05 % "GPU").encode())
        figs = os.path.join(tp, "figs_linked")
        os.makedirs(figs)
        victim = os.path.join(tp, "victim.svg")
        write(victim, b"not a figure")
        os.symlink(victim, os.path.join(figs, "h100_workspace.svg"))
        case("figures_no_write_through_link", [py, fig, "--results", good, "--figures", figs], 2)
        case("figures_full_disk_no_figure",
             full_disk(4000, [py, fig, "--results", good, "--figures",
                              os.path.join(tp, "figs_new", "deeper")]), 2)
        inj = os.path.join(tp, "injected")
        os.makedirs(inj)
        write(os.path.join(inj, "h100.csv"), (header + row05 % '"A|B <img src=x>\n`c`"').encode())
        inj_readme = os.path.join(tp, "inj.md")
        write(inj_readme, b"# x\n\n<!-- results:begin -->\n<!-- results:end -->\n")
        case("control_figures_escapes_csv_text",
             [py, fig, "--results", inj, "--readme", inj_readme, "--figures",
              os.path.join(tp, "figs_inj")], 0,
             allowed=[inj_readme, os.path.join(tp, "figs_inj")],
             after=lambda: "" if "### A\\|B \\<img src=x\\> \\`c\\`" in open(inj_readme).read()
             else "the GPU name is not escaped: %r" % [
                 line for line in open(inj_readme) if line.startswith("###")])
    else:
        print("note: no matplotlib here: the figures' own cases are not asserted")

    # --- the results CSV writers: no FIFO read, no link followed or replaced, no empty path
    w = os.path.join(tp, "csv")
    os.makedirs(w)
    os.mkfifo(os.path.join(w, "fifo.csv"))
    write(os.path.join(w, "real.csv"), header.encode())
    os.symlink("real.csv", os.path.join(w, "link.csv"))
    old = header.replace(",run\n", "\n") + (row05 % "GPU").replace(",r1\n", "\n")
    write(os.path.join(w, "old.csv"), old.encode())
    os.symlink("old.csv", os.path.join(w, "old_link.csv"))
    write(os.path.join(w, "other.csv"), b"a,b\n1,2\n")
    migrate = [py, os.path.join(repo, "tools", "migrate_results.py")]
    peers = [py, os.path.join(repo, "tools", "peers.py"), "--csv"]
    case("migrate_fifo", migrate + [os.path.join(w, "fifo.csv")], 2)
    case("migrate_symlink_kept", migrate + [os.path.join(w, "old_link.csv")], 2)
    case("migrate_empty_path", migrate + [""], 2)
    case("migrate_device", migrate + ["/dev/null"], 2)
    case("control_migrate", migrate + [os.path.join(w, "old.csv")], 0,
         allowed=[os.path.join(w, "old.csv")],
         after=lambda: "" if open(os.path.join(w, "old.csv")).read().splitlines()[1].endswith(
             ",commit:abc") else "not migrated")
    for name, target in (("fifo", "fifo.csv"), ("symlink", "link.csv"), ("empty_path", ""),
                         ("device", "/dev/null"), ("folder", "."), ("other_header", "other.csv")):
        case("peers_csv_" + name, peers + [target], 2, cwd=w)
    write(os.path.join(w, "bom.csv"), b"\xef\xbb\xbf" + old.encode())
    case("control_migrate_bom_header", migrate + [os.path.join(w, "bom.csv")], 0,
         allowed=[os.path.join(w, "bom.csv")])

    # --- exercise.py: build folders it must not (re)configure, bad arguments, a full disk
    exercise = [py, os.path.join(repo, "tools", "exercise.py")]
    ex = os.path.join(tp, "exercises")  # a learner's copy: grade gets as far as the build
    shutil.copytree(os.path.join(REPO, "steps", "02_online_softmax"),
                    os.path.join(ex, "02_online_softmax"))
    case("exercise_create_dir_empty", exercise + ["create", "2", "--dir", ""], 2)
    case("exercise_grade_build_empty", exercise + ["grade", "2", "--dir", ex, "--build", ""], 2)
    main_build = os.path.join(tp, "main_build")
    os.makedirs(main_build)
    write(os.path.join(main_build, "CMakeCache.txt"), (
        "CMAKE_HOME_DIRECTORY:INTERNAL=%s\nLADDER_EXERCISES:PATH=\nLADDER_ENABLE_CUDA:BOOL=ON\n"
        % repo).encode())
    case("exercise_grade_main_build", exercise + ["grade", "2", "--dir", ex, "--build",
                                                  main_build], 2)
    other_build = os.path.join(tp, "other_build")
    os.makedirs(other_build)
    write(os.path.join(other_build, "CMakeCache.txt"), (
        "CMAKE_HOME_DIRECTORY:INTERNAL=/elsewhere\nLADDER_EXERCISES:PATH=%s\n" % ex).encode())
    case("exercise_grade_other_tree_build", exercise + ["grade", "2", "--dir", ex, "--build",
                                                        other_build], 2)
    case("exercise_grade_build_not_a_build", exercise + ["grade", "2", "--dir", ex, "--build",
                                                         os.path.join(repo, "tools")], 2)
    case("exercise_grade_build_repository", exercise + ["grade", "2", "--dir", ex, "--build",
                                                        "."], 2)
    case("exercise_grade_jobs_0", exercise + ["grade", "2", "--dir", ex, "--jobs", "0"], 2)
    case("exercise_create_full_disk", full_disk(1000, exercise + [
        "create", "2", "--dir", os.path.join(tp, "ex_full", "deeper")]), 2,
        after=one_line)

    # --- bar_table.py, ab_table.py, harness_table.py, stalls.py: input errors in one line
    bar = [py, os.path.join(REPO, "tools", "bar_table.py")]
    b = os.path.join(tp, "bar")
    os.makedirs(b)
    rows = ("07,bf16,4,32,32,4096,4096,64,0,bwd,1.0,1,1,0,G,13,c,0,1,alt.1\n"
            "torch-cudnn,bf16,4,32,32,4096,4096,64,0,bwd,1.1,1,1,0,G,13,c,0,1,alt.1\n")
    write(os.path.join(b, "short.csv"), (header + "07,bf16,x\n").encode())
    write(os.path.join(b, "nan.csv"), (header + rows.replace(",64,", ",sixty-four,")).encode())
    write(os.path.join(b, "zero_ms.csv"), (header + rows.replace(",1.0,", ",0,")).encode())
    write(os.path.join(b, "binary.csv"), b"\xff\xfe\x00garbage")
    os.mkfifo(os.path.join(b, "fifo.csv"))
    write(os.path.join(b, "bom.csv"), b"\xef\xbb\xbf" + (header + rows.replace(
        "bf16", "bf|16")).encode())
    for name, arg in (("short_row", "short.csv"), ("not_a_number", "nan.csv"),
                      ("zero_ms", "zero_ms.csv"), ("not_utf8", "binary.csv"),
                      ("fifo", "fifo.csv"), ("folder", "."), ("missing", "none.csv")):
        case("bar_table_" + name, bar + [os.path.join(b, arg)], 2, after=one_line)
    case("control_bar_table_bom_escaped", bar + [os.path.join(b, "bom.csv")], 0,
         after=lambda out, err: "" if "| bf\\|16 | 64 |" in out else "table: %r" % out[:300])
    ab = os.path.join(tp, "ab")
    os.makedirs(ab)
    write(os.path.join(ab, "a-1.csv"), (header + rows).encode())
    write(os.path.join(ab, "b-1.csv"), (header + "07,bf16,4\n").encode())
    case("ab_table_short_row", [py, os.path.join(REPO, "tools", "ab_table.py"), ab], 2,
         after=one_line)
    case("harness_table_fifo", [py, os.path.join(REPO, "tools", "harness_table.py"),
                                os.path.join(b, "fifo.csv")], 2, after=one_line)
    stalls = [py, os.path.join(REPO, "tools", "stalls.py")]
    page = ("Kernel Name,k\nAddress,Source,%s,%s\n" % (
        "Warp Stall Sampling (All Samples)", "Instructions Executed") +
        "".join("0x%x,FFMA R1,%d,100\n" % (i, i) for i in range(400))).encode()
    whole = gzip.compress(page)
    write(os.path.join(tp, "page.sass.csv.gz"), whole)
    write(os.path.join(tp, "truncated.sass.csv.gz"), whole[:len(whole) // 2])
    write(os.path.join(tp, "corrupt.sass.csv.gz"), whole[:10] + b"\0" * 50 + whole[60:])
    case("control_stalls_gz", stalls + [os.path.join(tp, "page.sass.csv.gz")], 0)
    for name in ("truncated", "corrupt"):
        case("stalls_%s_gz" % name, stalls + [os.path.join(tp, name + ".sass.csv.gz")], 2,
             after=one_line)
    case("stalls_fifo", stalls + [os.path.join(b, "fifo.csv")], 2, after=one_line)

    # --- alternate.sh: PASSES checked; relative paths from the calling folder, not the repo's
    alt = [os.path.join(repo, "tools", "alternate.sh")]
    calling = os.path.join(tp, "calling")
    os.makedirs(calling)
    fake = os.path.join(tp, "fake_ladder")
    write(fake, b"#!/bin/sh\necho ladder \"$@\"\n")
    os.chmod(fake, 0o755)
    for passes in ("x", "0", "-1", "1.5", ""):
        case("alternate_passes_" + (passes or "empty").replace("-", "minus").replace(".", "_"),
             ["env", "LADDER=" + fake] + alt + ["r.csv", passes, "", "--selftest"], 2,
             cwd=calling)
    case("control_alternate_relative_paths",
         ["env", "LADDER=../fake_ladder", "OUT=logs"] + alt + ["r.csv", "1", "", "--selftest"],
         0, allowed=[os.path.join(calling, "logs")], cwd=calling,
         after=lambda out, err: "" if "--csv %s" % os.path.join(calling, "r.csv") in open(
             os.path.join(calling, "logs", "alternate.log")).read() else
         "the CSV was not taken from the calling folder")
    return cases


def run_case(name, argv, want, allowed, cwd, tmp, after=None, says=(), env=None, limit_as=None):
    """Runs one case between two snapshots of tmp; returns a failure text or "". `says`: texts
    its stderr must hold; `env`: variables set for it; `limit_as`: its address-space limit in
    bytes (ulimit -v)."""
    import resource
    before = snapshot(tmp)
    t0 = time.time()
    limit = None if limit_as is None else (
        lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as)))
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd,
                           env=None if env is None else dict(os.environ, **env), preexec_fn=limit)
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = "timeout", "", ""
    took = time.time() - t0
    changed = changes(before, snapshot(tmp), allowed if want == 0 else ())
    problems = []
    if rc != want:
        problems.append("exit %s (want %d)" % (rc, want))
    if want == 2 and "error:" not in err:
        problems.append("no error: message")
    if "Traceback" in err or "Success" in err:
        problems.append("a traceback or a 'Success' error")
    problems += ["stderr does not say %r" % t for t in says if t not in err]
    if changed:
        problems.append("changed %s" % [os.path.relpath(p, tmp) for p in changed[:5]])
    if want == 2 and took > 20:
        problems.append("took %.0f s to refuse" % took)
    if not problems and after:
        # after() checks the files; after(out, err) what the case printed too
        problems += [a for a in [after(out, err) if after.__code__.co_argcount == 2
                                 else after()] if a]
    if problems:
        return "%s\n     %s\n     stderr: %s" % ("; ".join(problems), " ".join(argv)[:300],
                                                   err.strip()[-400:])
    print("ok   %-34s exit %s  %s" % (name, rc, err.strip().splitlines()[-1][:100]
                                      if err.strip() else ""))
    return ""


def concurrent_saves(tmp, rounds=12):
    """Two saves into one folder at once (a forward and a backward run) end with one of them
    whole: exit 0 both, the folder holding exactly one run's files and no temporary."""
    out = os.path.join(tmp, "concurrent")
    oracle = os.path.join(BIN, "00_cpu_reference")
    base = [oracle, "--seq-q", "9", "--seq-k", "9", "--repeats", "1", "--warmup", "0", "--save",
            out]
    bad = []
    for k in range(rounds):
        procs = [subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True),
                 subprocess.Popen(base + ["--backward"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)]
        errs = [p.communicate()[1] for p in procs]
        names = sorted(os.listdir(out))
        if [p.returncode for p in procs] != [0, 0] or names not in (
                ["lse.npy", "o.npy"], ["dk.npy", "dq.npy", "dv.npy", "lse.npy", "o.npy"]):
            bad.append("round %d: exit %s, files %s, %s" % (k, [p.returncode for p in procs],
                                                             names, " ".join(errs)[-200:]))
    print(("ok   " if not bad else "FAIL ") + "%-34s %d rounds %s" % (
        "concurrent_saves", rounds, bad[:2] if bad else ""))
    return len(bad) > 0


def third_pass_cpp(tmp, good):
    """Issue #36's reproducers for the C++ programs, as second_pass()'s cases plus run_case's
    options: a save replaces its folder as a whole, keeping every other entry, and removes the
    staging a killed save left (only its own: a live run's is locked); memory that does not fit
    under `ulimit -v` is exit 2 naming it; an invalid $LADDER_HOST_MEMORY is exit 2 naming the
    variable and its form."""
    import fcntl
    cases = []
    tp = os.path.join(tmp, "third_cpp")
    os.makedirs(tp)

    def case(name, argv, want, allowed=(), cwd=None, after=None, **opts):
        cases.append((name, argv, want, allowed, cwd, after, opts))

    S02 = os.path.join(BIN, "02_online_softmax")
    tiny = ["--seq-q", "8", "--seq-k", "8", "--repeats", "1", "--warmup", "0"]

    # --- --save: the other entries of the folder are carried over whole (a subfolder, a link,
    # a FIFO, a file); the stale dq.npy of a backward run goes; nothing is left beside it
    keep = os.path.join(tp, "keep")
    os.makedirs(os.path.join(keep, "sub", "deeper"))
    write(os.path.join(keep, "notes.txt"), b"mine")
    write(os.path.join(keep, "sub", "deeper", "f.txt"), b"mine too")
    os.symlink("notes.txt", os.path.join(keep, "link"))
    os.mkfifo(os.path.join(keep, "fifo"))
    write(os.path.join(keep, "dq.npy"), b"stale")
    case("save_keeps_other_entries", [S02] + tiny + ["--save", keep], 0,
         allowed=[os.path.join(keep, n) for n in ("o.npy", "lse.npy", "dq.npy")],
         after=lambda: "" if sorted(os.listdir(keep)) == [
             "fifo", "link", "lse.npy", "notes.txt", "o.npy", "sub"] else
         "keep/: %s" % sorted(os.listdir(keep)))
    here = os.path.join(tp, "here")
    os.makedirs(here)
    write(os.path.join(here, "notes.txt"), b"mine")
    case("save_into_current_folder", [S02] + tiny + ["--save", "."], 0, cwd=here,
         allowed=[os.path.join(here, n) for n in ("o.npy", "lse.npy")])
    # A killed save's staging folder is removed by the next save into the same folder; a live
    # run's (locked) stays, and so do names that only look like staging.
    st = os.path.join(tp, "stale")
    os.makedirs(os.path.join(st, "out"))
    dead = os.path.join(st, ".out.ladder-save.0123456789abcdef")
    os.makedirs(os.path.join(dead, "sub"))
    write(os.path.join(dead, "o.npy"), b"half")
    for decoy in (".out.ladder-save.notmine", ".other.ladder-save.0123456789abcdef",
                  "out.ladder-save.0123456789abcdef"):
        os.makedirs(os.path.join(st, decoy))
    live = os.path.join(st, ".out.ladder-save.fedcba9876543210")
    os.makedirs(live)
    held = os.open(live, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)

    def stale_after():
        os.close(held)
        return "" if not os.path.exists(dead) and os.path.isdir(live) else \
            "left: %s" % sorted(os.listdir(st))
    case("save_removes_only_stale_staging", [S02] + tiny + ["--save", os.path.join(st, "out")], 0,
         allowed=[dead] + [os.path.join(st, "out", n) for n in ("o.npy", "lse.npy")],
         after=stale_after)

    # --- memory: refused by the estimate, or an allocation that fails all the same, exit 2
    # naming the memory (an address-space limit starves AddressSanitizer's shadow memory)
    big = ["--seq-q", "4096", "--seq-k", "4096", "--heads", "16", "--batch", "4", "--check",
           "full", "--save", os.path.join(tp, "big_save")]
    if "ASAN_OPTIONS" not in os.environ:
        case("ulimit_v_refused", [S02] + big, 2, says=("GiB", "ulimit -v"), limit_as=400 << 20)
        case("ulimit_v_allocation_fails", [S02] + big, 2, says=("out of host memory", "GiB"),
             env={"LADDER_HOST_MEMORY": str(10 ** 12)}, limit_as=400 << 20)
        case("ulimit_v_bench_skips", [LADDER, "bench", "--steps", "2", "--seqlens", "4096",
                                      "--dims", "64", "--tokens", "65536", "--hidden", "1024",
                                      "--causal", "0", "--directions", "fwd"], 2,
             limit_as=400 << 20)
    else:
        print("note: under AddressSanitizer the ulimit -v cases are not run")
    says = ("LADDER_HOST_MEMORY", "whole number of bytes")
    for label, value in {"abc": "abc", "minus_5": "-5", "empty": "", "1e999": "1e999",
                         "space_5": " 5", "zero": "0", "1.5": "1.5"}.items():
        case("host_memory_env_" + label, [S02] + tiny + ["--save", os.path.join(tp, "env_save")],
             2, says=says, env={"LADDER_HOST_MEMORY": value})
    for verb in (["run", "2"] + tiny, ["compare", "--steps", "1", "--seq-q", "8", "--seq-k", "8"],
                 ["bench", "--steps", "2", "--seqlens", "32", "--dims", "8", "--causal", "0",
                  "--directions", "fwd", "--repeats", "1"],
                 ["diff", os.path.join(good, "k.npy"), os.path.join(good, "v.npy")]):
        case("host_memory_env_ladder_" + verb[0], [LADDER] + verb, 2, says=says,
             env={"LADDER_HOST_MEMORY": "abc"})
    case("control_host_memory_env", [S02] + tiny, 0, env={"LADDER_HOST_MEMORY": "17179869184"})

    # --- ladder verify with the backward inferred from dq/dk/dv.npy: do.npy's header is checked
    # against q.npy's as with --backward (read as [B, H, M, d] whatever it said, (1,) was a
    # double free, (0,) a segfault, and one column too many graded on a misread dO)
    grads = os.path.join(tp, "verify_grads")
    os.makedirs(grads)
    for n, shape in (("o.npy", SHAPE_Q), ("lse.npy", SHAPE_Q[:3]), ("dq.npy", SHAPE_Q),
                     ("dk.npy", SHAPE_KV), ("dv.npy", SHAPE_KV)):
        write(os.path.join(grads, n), npy(shape))
    for label, shape in (("1", (1,)), ("0", (0,)), ("dim_plus_1", SHAPE_Q[:3] + (SHAPE_Q[3] + 1,))):
        load = inputs(os.path.join(tp, "do_" + label), **{"do.npy": npy(shape)})
        case("verify_inferred_backward_do_" + label,
             [LADDER, "verify", "--load", load, "--dtype", "fp32", "--outputs", grads], 2,
             says=("do.npy",))
    # gradients as broken links are there (exit 2 reading them), not a forward pass to grade
    links = os.path.join(tp, "verify_grad_links")
    os.makedirs(links)
    for n, shape in (("o.npy", SHAPE_Q), ("lse.npy", SHAPE_Q[:3])):
        write(os.path.join(links, n), npy(shape))
    for n in ("dq.npy", "dk.npy", "dv.npy"):
        os.symlink(os.path.join(tp, "nowhere", n), os.path.join(links, n))
    case("verify_gradients_broken_links",
         [LADDER, "verify", "--load", inputs(os.path.join(tp, "do_good"), **{"do.npy": npy(SHAPE_Q)}),
          "--dtype", "fp32", "--outputs", links], 2)
    return cases


def strace_works():
    """Whether strace can trace a child here (installed, and ptrace allowed)."""
    if not shutil.which("strace"):
        return False
    r = subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True)
    return r.returncode == 0


def signal_at_call(argv, call, n, sig):
    """argv under strace, which sends `sig` (KILL, TERM) as the nth call of `call` begins.
    Returns its exit status (0: it ended before an nth call), None if strace does not know
    the call here."""
    env = dict(os.environ)
    if "ASAN_OPTIONS" in env:  # LeakSanitizer cannot run under ptrace: it would fail every run
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    r = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=" + call, "-e",
                        "inject=%s:signal=%s:when=%d" % (call, sig, n), "--"] + argv,
                       capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0 and r.stderr.startswith("strace:"):
        return None
    return r.returncode


def every_interruption(label, argv, calls, before, check):
    """Runs argv interrupted at every call of `calls`, by SIGKILL then SIGTERM (with strace; a
    sweep of SIGKILL and SIGTERM at growing delays without it), calling before() ahead of each
    run and check(what, sig) after each interruption; returns how many it made and check's
    complaints."""
    bad, made = [], 0
    if strace_works():
        for sig in ("KILL", "TERM"):
            for call in calls:
                for n in range(1, 201):
                    before()
                    rc = signal_at_call(argv, call, n, sig)
                    if rc is None or rc == 0:
                        break  # unknown here, or the run ended before an nth call
                    made += 1
                    bad += check("%s at %s #%d" % (sig, call, n), sig)
                else:
                    bad.append("%s at %s: still interrupted at the 200th call" % (sig, call))
        return made, bad
    import signal
    print("note: %s: no strace here, so interrupted at growing delays instead" % label)
    t0 = time.time()
    subprocess.run(argv, capture_output=True)
    took = time.time() - t0
    for sig in ("KILL", "TERM"):
        for k in range(40):
            before()
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(took * k / 40)
            p.send_signal(getattr(signal, "SIG" + sig))
            if p.wait() != 0:
                made += 1
                bad += check("%s after %.0f ms" % (sig, 1000 * took * k / 40), sig)
    return made, bad


def interrupted_saves(tmp):
    """A save interrupted at every step (the nth call of each file-system call it makes, by
    SIGKILL and by SIGTERM) leaves its folder holding the complete old set of files or the
    complete new set, with the other entries of the folder; a SIGTERM leaves no staging beside
    it, and after a SIGKILL the next save removes what was left."""
    root = os.path.join(tmp, "interrupted_save")
    out = os.path.join(root, "out")
    os.makedirs(os.path.join(out, "sub"))
    write(os.path.join(out, "notes.txt"), b"mine")
    write(os.path.join(out, "sub", "f.txt"), b"mine too")
    base = [ORACLE, "--seq-q", "9", "--seq-k", "9", "--repeats", "1", "--warmup", "0", "--save",
            out]
    old_run, new_run = base, base + ["--backward", "--seed", "7"]

    def save(argv):
        return subprocess.run(argv, capture_output=True).returncode
    save(new_run)
    new = snapshot(out)
    save(old_run)
    old = snapshot(out)

    def before():  # from the old set (a run that was not interrupted saved the new one)
        if snapshot(out) != old:
            save(old_run)

    def check(what, sig):
        bad = []
        state, left = snapshot(out), sorted(set(os.listdir(root)) - {"out"})
        if state not in (old, new):
            bad.append("%s: neither the old nor the new set: %s" % (
                what, sorted(os.path.relpath(p, out) for p in state)))
        if sig == "TERM" and left:
            bad.append("%s: left %s" % (what, left))
        rc = save(old_run)  # the next save: the old set again, nothing left
        if rc != 0 or snapshot(out) != old or set(os.listdir(root)) != {"out"}:
            bad.append("%s: the next save exits %s, leaves %s" % (what, rc,
                                                                 sorted(os.listdir(root))))
        return bad
    calls = ("mkdir", "openat", "write", "fsync", "flock", "linkat", "chmod", "chown",
             "renameat2", "rename", "unlink", "rmdir")
    made, bad = every_interruption("interrupted_saves", new_run, calls, before, check)
    ok = not bad and made >= 20
    print(("ok   " if ok else "FAIL ") + "%-34s %d interruptions %s" % (
        "save_interrupted_everywhere", made, bad[:3] if bad else ""))
    return not ok


def interrupted_csv(tmp):
    """`ladder bench --csv` interrupted at every step of its write (the lock, the fsyncs, the
    rename, a removal; by SIGKILL and SIGTERM) leaves the file with its old rows or with them
    and the new one; a SIGTERM leaves no temporary, and the next run removes a SIGKILL's."""
    root = os.path.join(tmp, "interrupted_csv")
    os.makedirs(root)
    csv = os.path.join(root, "r.csv")
    bench = [LADDER, "bench", "--steps", "2", "--seqlens", "32", "--dims", "8", "--causal", "0",
             "--directions", "fwd", "--repeats", "1", "--warmup", "0", "--csv", csv]
    subprocess.run(bench, capture_output=True)
    lines = []  # what the file held before the interrupted run

    def before():
        lines[:] = open(csv).read().splitlines()

    def check(what, sig):
        bad = []
        now = open(csv).read().splitlines()
        if now != lines and not (now[:-1] == lines and len(now) == len(lines) + 1):
            bad.append("%s: %d lines, from %d" % (what, len(now), len(lines)))
        left = sorted(set(os.listdir(root)) - {"r.csv"})
        if sig == "TERM" and left:
            bad.append("%s: left %s" % (what, left))
        r = subprocess.run(bench, capture_output=True, text=True)
        then = open(csv).read().splitlines()
        if r.returncode != 0 or then[:-1] != now or os.listdir(root) != ["r.csv"]:
            bad.append("%s: the next run exits %s, %d lines, leaves %s %s" % (
                what, r.returncode, len(then), sorted(os.listdir(root)), r.stderr[-200:]))
        return bad
    made, bad = every_interruption("interrupted_csv", bench, ("flock", "fsync", "rename",
                                                              "unlink"), before, check)
    ok = not bad and made >= 4
    print(("ok   " if ok else "FAIL ") + "%-34s %d interruptions %s" % (
        "csv_interrupted_everywhere", made, bad[:3] if bad else ""))
    return not ok


def concurrent_results(tmp, rounds=3):
    """Three `ladder bench --csv` and a `ladder compare --csv` into one file at once keep every
    run's rows: one locked read-merge-write each."""
    root = os.path.join(tmp, "concurrent_csv")
    os.makedirs(root)
    csv = os.path.join(root, "r.csv")
    bench = [LADDER, "bench", "--steps", "2", "--seqlens", "32", "--dims", "8", "--causal", "0",
             "--directions", "fwd", "--repeats", "1", "--warmup", "0", "--csv", csv]
    compare = [LADDER, "compare", "--steps", "1", "--seq-q", "8", "--seq-k", "8", "--repeats",
               "1", "--warmup", "0", "--csv", csv]
    ids, bad = [], []
    for k in range(rounds):
        runs = [(bench, "b%d_%d" % (k, i)) for i in range(3)] + [(compare, "c%d" % k)]
        procs = [subprocess.Popen(argv + ["--run-id", rid], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for argv, rid in runs]
        outs = [p.communicate() for p in procs]
        ids += [rid for _, rid in runs]
        if any(p.returncode != 0 for p in procs):
            bad.append("round %d: exit %s %s" % (k, [p.returncode for p in procs],
                                                  " ".join(e for _, e in outs)[-200:]))
        if not all("added 1 row to" in o for o, _ in outs):
            bad.append("round %d: %s" % (k, [o.strip().splitlines()[-1:] for o, _ in outs]))
    rows = open(csv).read().splitlines()[1:]
    got = sorted(r.rsplit(",", 1)[-1] for r in rows)
    if got != sorted(ids) or os.listdir(root) != ["r.csv"]:
        bad.append("run ids %s, files %s" % (got, os.listdir(root)))
    print(("ok   " if not bad else "FAIL ") + "%-34s %d rows of %d runs %s" % (
        "concurrent_csv_writers", len(rows), len(ids), bad[:2] if bad else ""))
    return len(bad) > 0


def estimate_within_2x(tmp):
    """The memory a run is estimated to need is within 2x of what it peaks at (a full check of
    a long key sequence, where the oracle's scratch dominates)."""
    import re
    if "ASAN_OPTIONS" in os.environ:  # the asan build: its shadow memory is not the run's
        print("ok   %-34s not measured under AddressSanitizer" % "memory_estimate_within_2x")
        return False
    argv = [os.path.join(BIN, "01_three_pass_softmax"), "--heads", "2", "--seq-q", "64",
            "--seq-k", "150000", "--dim", "1", "--repeats", "1", "--warmup", "0"]
    env = dict(os.environ, LADDER_HOST_MEMORY="1")
    m = re.search(r"needs about ([0-9.]+) GiB", subprocess.run(
        argv, capture_output=True, text=True, env=env).stderr)
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
             "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN)"
             ".ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", probe] + argv, capture_output=True, text=True)
    ok = m is not None and r.returncode == 0
    est = float(m.group(1)) * 2 ** 30 if m else 0
    peak = int(r.stdout.strip() or 0) * 1024
    ok = ok and peak / 2 <= est <= 2 * peak
    print(("ok   " if ok else "FAIL ") + "%-34s estimate %.0f MiB, peak %.0f MiB" % (
        "memory_estimate_within_2x", est / 2 ** 20, peak / 2 ** 20))
    return not ok


def main():
    tmp = tempfile.mkdtemp(prefix="ladder_corpus_")
    cases = []  # (name, argv, expected exit)

    def load_case(name, **override):
        d = inputs(os.path.join(tmp, name), **override)
        cases.append((name, [STEP, "--load", d], 2))

    # --- .npy files that are broken or not what the ladder reads
    good_q = npy(SHAPE_Q)
    load_case("bad_magic", **{"q.npy": npy(SHAPE_Q, magic=b"\x93NUMPZ")})
    load_case("truncated_preamble", **{"q.npy": good_q[:7]})
    load_case("truncated_header", **{"q.npy": good_q[:40]})
    load_case("truncated_data", **{"q.npy": good_q[:-4]})
    load_case("trailing_bytes", **{"q.npy": good_q + b"\0\0\0\0"})
    load_case("empty_file", **{"q.npy": b""})
    load_case("version_9", **{"q.npy": npy(SHAPE_Q, version=9)})
    load_case("fortran_order", **{"q.npy": npy(SHAPE_Q, fortran=True)})
    load_case("big_endian", **{"q.npy": npy(SHAPE_Q, descr=">f4")})
    load_case("int32", **{"q.npy": npy(SHAPE_Q, descr="<i4", values=[1] * 272)})
    load_case("complex", **{"q.npy": npy(SHAPE_Q, descr="<c8")})
    load_case("zero_d", **{"q.npy": npy((), values=[1.0])})
    load_case("one_d", **{"q.npy": npy((17,))})
    load_case("five_d", **{"q.npy": npy((1, 1, 2, 17, 8))})
    load_case("zero_dim", **{"q.npy": npy((1, 2, 0, 8)), "k.npy": npy((1, 2, 0, 8)),
                             "v.npy": npy((1, 2, 0, 8))})
    load_case("huge_dims_header", **{"q.npy": npy(SHAPE_Q)[:128].replace(b"17", b"9" * 2, 1)})
    big = ("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 1, 8), }")
    big += " " * ((64 - (10 + len(big) + 1) % 64) % 64) + "\n"
    load_case("overflowing_shape", **{"q.npy": b"\x93NUMPY\x01\x00" + struct.pack("<H", len(big)) +
                                      big.encode()})
    load_case("kv_shapes_differ", **{"v.npy": npy((1, 2, 24, 8))})
    load_case("dims_differ", **{"k.npy": npy((1, 2, 23, 16)), "v.npy": npy((1, 2, 23, 16))})
    load_case("batch_differs", **{"k.npy": npy((2, 2, 23, 8)), "v.npy": npy((2, 2, 23, 8))})
    load_case("heads_not_multiple", **{"k.npy": npy((1, 3, 23, 8)), "v.npy": npy((1, 3, 23, 8))})
    nan = float("nan")
    load_case("nan", **{"q.npy": npy(SHAPE_Q, values=[0.5] * 100 + [nan])})
    load_case("inf", **{"k.npy": npy(SHAPE_KV, values=[float("inf")])})
    load_case("overflows_fp32", **{"q.npy": npy(SHAPE_Q, descr="<f8", values=[1e300])})
    load_case("missing_v", **{"v.npy": None})
    # do.npy with --backward
    d = inputs(os.path.join(tmp, "missing_do"))
    cases.append(("missing_do", [ORACLE, "--load", d, "--backward"], 2))
    d = inputs(os.path.join(tmp, "do_wrong_shape"), **{"do.npy": npy((1, 2, 16, 8))})
    cases.append(("do_wrong_shape", [ORACLE, "--load", d, "--backward"], 2))

    # --- files that are not regular files
    d = inputs(os.path.join(tmp, "q_is_directory"), **{"q.npy": None})
    os.mkdir(os.path.join(d, "q.npy"))
    cases.append(("q_is_directory", [STEP, "--load", d], 2))
    d = inputs(os.path.join(tmp, "q_is_fifo"), **{"q.npy": None})
    os.mkfifo(os.path.join(d, "q.npy"))
    cases.append(("q_is_fifo", [STEP, "--load", d], 2))
    d = inputs(os.path.join(tmp, "symlink_loop"), **{"q.npy": None})
    os.symlink("q.npy", os.path.join(d, "q.npy"))
    cases.append(("symlink_loop", [STEP, "--load", d], 2))
    d = inputs(os.path.join(tmp, "dangling_symlink"), **{"q.npy": None})
    os.symlink("nowhere.npy", os.path.join(d, "q.npy"))
    cases.append(("dangling_symlink", [STEP, "--load", d], 2))
    cases.append(("load_not_a_directory", [STEP, "--load", os.path.join(tmp, "nope")], 2))

    # --- block masks (shape [1, 1, ceil(17/16), ceil(23/16)] with --mask-block 16)
    good = inputs(os.path.join(tmp, "mask_inputs"))
    def mask_case(name, data, extra=()):
        path = os.path.join(tmp, name + ".npy")
        write(path, data)
        cases.append((name, [STEP, "--load", good, "--block-mask", path, "--mask-block", "16",
                             *extra], 2))
    mask_case("mask_wrong_shape", npy((1, 1, 2, 3), descr="|u1", values=[1] * 6))
    mask_case("mask_value_2", npy((1, 1, 2, 2), descr="|u1", values=[1, 2, 1, 1]))
    mask_case("mask_float", npy((1, 1, 2, 2), values=[1.0] * 4))
    mask_case("mask_three_d", npy((1, 2, 2), descr="|u1", values=[1] * 4))
    cases.append(("mask_and_sparsity", [STEP, "--block-sparsity", "random:0.5", "--block-mask",
                                        os.path.join(tmp, "mask_float.npy")], 2))
    cases.append(("mask_missing", [STEP, "--block-mask", os.path.join(tmp, "none.npy")], 2))
    cases.append(("sparsity_bad_kind", [STEP, "--block-sparsity", "diagonal:3"], 2))
    cases.append(("sparsity_bad_rho", [STEP, "--block-sparsity", "random:1.5"], 2))
    cases.append(("sparsity_zero_width", [STEP, "--block-sparsity", "local:0"], 2))
    cases.append(("mask_block_zero", [STEP, "--block-sparsity", "local:1", "--mask-block", "0"], 2))
    cases.append(("mask_block_not_tile_multiple", [STEP, "--variant", "tiled", "--block-sparsity",
                                                   "local:1", "--mask-block", "100"], 2))
    cases.append(("mask_unsupported_rung", [os.path.join(BIN, "01_three_pass_softmax"),
                                            "--block-sparsity", "local:1"], 2))

    # --- flags: sizes that overflow or exceed the machine, values out of range
    flag_cases = {
        "batch_overflows_int64": ["--batch", "99999999999999999999"],
        "product_overflows": ["--batch", "4294967296", "--heads", "4294967296", "--seq-q", "1",
                              "--seq-k", "1", "--dim", "1"],
        "extent_over_2_31": ["--dim", "4000000000"],
        "too_big_for_memory": ["--batch", "100000", "--heads", "1000", "--seq-q", "100000"],
        "negative_seq": ["--seq-q", "-3"],
        "not_a_number": ["--heads", "eight"],
        "heads_not_multiple": ["--heads", "8", "--heads-kv", "3"],
        "scale_zero": ["--scale", "0"],
        "scale_nan": ["--scale", "nan"],
        "dropout_one": ["--dropout", "1"],
        "dropout_nan": ["--dropout", "nan"],
        "dropout_negative": ["--dropout", "-0.1"],
        "tile_past_sequence": ["--seq-q", "16", "--seq-k", "16", "--variant", "tiled",
                               "--tile-q", "30000", "--tile-k", "30000"],
        "tile_int_max": ["--variant", "tiled", "--tile-q", "2147483647"],
        "tile_on_untiled_variant": ["--tile-q", "8"],
        "unknown_variant": ["--variant", "quantum"],
        "unknown_dtype": ["--dtype", "fp8"],
        "unsupported_dtype": ["--dtype", "bf16"],
        "check_mode": ["--check", "maybe"],
        "inputs_kind": ["--inputs", "huge"],
        "save_is_a_file": ["--save", os.path.join(tmp, "mask_float.npy")],
        "load_with_shape": ["--load", good, "--seq-q", "4"],
        "repeats_zero": ["--repeats", "0"],
    }
    for name, argv in flag_cases.items():
        cases.append((name, [STEP, *argv], 2))
    cases.append(("oracle_overflows_float64",
                  [ORACLE, "--load", inputs(os.path.join(tmp, "f64_huge"),
                                            **{"q.npy": npy(SHAPE_Q, descr="<f8", values=[1e200] * 272),
                                               "k.npy": npy(SHAPE_KV, descr="<f8", values=[1e200] * 368)})],
                  2))

    # --- the driver
    ladder_cases = {
        "run_product_overflows": ["run", "1", "--batch", "4294967296", "--heads", "4294967296",
                                  "--seq-q", "1", "--seq-k", "1", "--dim", "1"],
        "compare_too_big": ["compare", "--seq-q", "100000000", "--seq-k", "4"],
        "compare_overflows": ["compare", "--batch", "4294967296", "--heads", "4294967296"],
        "bench_seqlen_overflows": ["bench", "--steps", "2", "--seqlens", "4611686018427387904",
                                   "--dims", "64", "--directions", "fwd", "--causal", "0"],
        "bench_seqlen_not_int": ["bench", "--seqlens", "99999999999999999999999"],
        "diff_tol_nan": ["diff", os.path.join(good, "k.npy"), os.path.join(good, "v.npy"),
                         "--tol", "nan"],
        "diff_tol_negative": ["diff", os.path.join(good, "k.npy"), os.path.join(good, "v.npy"),
                              "--tol", "-1"],
        "diff_shapes": ["diff", os.path.join(good, "q.npy"), os.path.join(good, "v.npy")],
        "diff_fifo": ["diff", os.path.join(tmp, "q_is_fifo", "q.npy"), os.path.join(good, "v.npy")],
        "run_unknown_rung": ["run", "42"],
        "bench_bad_dropout": ["bench", "--dropout", "1.5"],
    }
    # ladder verify: outputs made elsewhere; bad input is 2, a wrong result 1 (never 0).
    vout, vshape, vpart = (os.path.join(tmp, d) for d in
                           ("verify_out", "verify_wrong_shape", "verify_partial_backward"))
    for d in (vout, vshape, vpart):
        os.makedirs(d)
    write(os.path.join(vout, "o.npy"), npy(SHAPE_Q))
    write(os.path.join(vout, "lse.npy"), npy(SHAPE_Q[:3]))
    write(os.path.join(vshape, "o.npy"), npy(SHAPE_KV))
    write(os.path.join(vshape, "lse.npy"), npy(SHAPE_Q[:3]))
    write(os.path.join(vpart, "o.npy"), npy(SHAPE_Q))
    write(os.path.join(vpart, "lse.npy"), npy(SHAPE_Q[:3]))
    write(os.path.join(vpart, "dq.npy"), npy(SHAPE_Q))
    verify = ["verify", "--load", good, "--dtype", "fp32", "--outputs"]
    ladder_cases.update({
        "verify_no_dtype": ["verify", "--load", good, "--outputs", vout],
        "verify_no_load": ["verify", "--dtype", "fp32", "--outputs", vout],
        "verify_outputs_missing": verify + [os.path.join(tmp, "nope")],
        "verify_outputs_wrong_shape": verify + [vshape],
        "verify_partial_backward": verify + [vpart],
        "verify_backward_without_grads": verify + [vout, "--backward"],
        "verify_save_refused": verify + [vout, "--save", os.path.join(tmp, "verify_saved")],
    })
    for name, argv in ladder_cases.items():
        cases.append((name, [LADDER, *argv], 2))
    cases.append(("verify_wrong_result", [LADDER, *verify, vout], 1))

    # --- controls: the same programs on good input succeed
    cases.append(("control_load", [STEP, "--load", good], 0))
    mask_ok = os.path.join(tmp, "mask_ok.npy")
    write(mask_ok, npy((1, 1, 2, 2), descr="|b1", values=[1, 0, 1, 1]))
    cases.append(("control_mask", [STEP, "--load", good, "--variant", "tiled", "--tile-q", "16",
                                   "--tile-k", "16", "--block-mask", mask_ok, "--mask-block", "16"], 0))
    cases.append(("control_dropout", [STEP, "--seq-q", "33", "--seq-k", "47", "--dropout", "0.3"], 0))

    failures = 0
    failures += integrity(tmp, good)
    for name, argv, want in cases:
        out = os.path.join(tmp, "out_" + name)
        full = argv + (["--save", out] if argv[0] != LADDER and "--save" not in argv else [])
        why = run_case(name, full, want, [out], None, tmp)
        if why:
            failures += 1
            print("FAIL %-34s %s" % (name, why))
    for name, argv, want, allowed, cwd, after in second_pass(tmp, good):
        why = run_case(name, argv, want, allowed, cwd, tmp, after)
        if why:
            failures += 1
            print("FAIL %-34s %s" % (name, why))
        cases.append(name)
    for name, argv, want, allowed, cwd, after in third_pass_tools(tmp):
        why = run_case(name, argv, want, allowed, cwd, tmp, after)
        if why:
            failures += 1
            print("FAIL %-34s %s" % (name, why))
        cases.append(name)
    for name, argv, want, allowed, cwd, after, opts in third_pass_cpp(tmp, good):
        why = run_case(name, argv, want, allowed, cwd, tmp, after, **opts)
        if why:
            failures += 1
            print("FAIL %-34s %s" % (name, why))
        cases.append(name)
    failures += concurrent_saves(tmp)
    failures += interrupted_saves(tmp)
    failures += interrupted_csv(tmp)
    failures += concurrent_results(tmp)
    failures += estimate_within_2x(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    print("%d cases, %d failed" % (len(cases), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
