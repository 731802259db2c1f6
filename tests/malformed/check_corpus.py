#!/usr/bin/env python3
"""Bad input never crashes, never lies, never writes: the malformed-input corpus.

  check_corpus.py STEP_BIN_DIR LADDER_BINARY

Generates, in a temporary folder, one case per class of bad input (broken .npy files, wrong
shapes and dtypes, non-finite values, missing and non-regular files, bad block masks, sizes
that overflow or exceed the machine, flags out of range), runs a step program or the `ladder`
driver on each, and checks that every case exits 2 with an "error:" message on stderr, does
not crash, and leaves the --save folder without a single file. A few valid controls must
exit 0, so that the corpus cannot pass by refusing everything. Needs only the standard library.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

BIN, LADDER = sys.argv[1], sys.argv[2]
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
    for name, argv in ladder_cases.items():
        cases.append((name, [LADDER, *argv], 2))

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
        try:
            r = subprocess.run(full, capture_output=True, text=True, timeout=120)
            rc, err = r.returncode, r.stderr
        except subprocess.TimeoutExpired:
            rc, err = "timeout", ""
        wrote = os.path.exists(out) and (want != 0 and bool(os.listdir(out)))
        ok = rc == want and not wrote and (want == 0 or "error:" in err)
        if not ok:
            failures += 1
            print("FAIL %-28s exit %s (want %d)%s\n     %s\n     stderr: %s" % (
                name, rc, want, ", wrote files" if wrote else "", " ".join(full)[:300],
                err.strip()[:400]))
        else:
            print("ok   %-28s exit %s  %s" % (name, rc, err.strip().splitlines()[0][:110] if err.strip() else ""))
    shutil.rmtree(tmp, ignore_errors=True)
    print("%d cases, %d failed" % (len(cases), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
