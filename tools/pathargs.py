"""The one rule for the path arguments of the Python tools (tools/*.py).

  - An empty path is refused: "" is not the current folder (Path("") is ".", which made
    `figures.py --results ""` read the repository's root and `exercise.py --build ""` configure
    CMake in it).
  - A path whose last component is a symbolic link, a FIFO, a device or a socket is refused before
    anything is read or written: a link is never written through (a file outside the folder
    named would change) nor read through (a link to /dev/zero), and a FIFO never blocks a reader.
    Give the path a link points to instead.
  - Files are read by read_bytes/read_text only: opened without following a link and without
    blocking (O_NOFOLLOW | O_NONBLOCK), checked to be a regular file on the open descriptor, and
    read up to a bound (a file larger than the bound is refused, never read to exhaustion).
  - An output is replaced only by renaming over it a file the tool itself wrote in the same
    folder (a temporary: written, fsync'ed, then os.replace). Staged collects several outputs:
    every temporary is written first, and only when all of them were is any renamed into place,
    so a failure (a full disk, a read-only folder) leaves every output as it was.
  - A results CSV is appended to by merge_csv: under an exclusive flock of the CSV's folder (the
    lock the ladder's C++ writers take, common/files.hpp FolderLock), the file is read as it is
    now, the new lines added and the whole renamed into place; two writers at once take turns,
    and neither loses the other's rows.

Errors are PathError, whose text names the argument and says why; the tools print it as
`<tool>: error: <text>` and exit with status 2.
"""
import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from pathlib import Path

MAX_READ = 256 << 20  # the largest file a tool reads (the results files are well under 1 MiB)


class PathError(Exception):
    """A path argument that cannot be used (exit status 2)."""


def kind_of(mode):
    """What a stat mode names, for messages: 'a FIFO', 'a folder', ..."""
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return what
    return "not a regular file"


def _name(path, arg):
    """The path as a Path; refuses an empty one (or one with a NUL byte)."""
    text = os.fspath(path) if path is not None else ""
    if text == "":
        raise PathError(f"{arg}: an empty path names no file or folder (\"\" is not the "
                        "current folder; write . for that)")
    if "\0" in text:
        raise PathError(f"{arg} {text!r}: a path cannot hold a NUL byte")
    return Path(text)


def _lstat(path, arg):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise PathError(f"{arg} {path}: a folder on the way is a file") from None
    except OSError as e:
        raise PathError(f"{arg} {path}: {e.strerror}") from None


def _no_link(path, arg, st):
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" (it points to {os.readlink(path)})"
        except OSError:
            target = ""
        raise PathError(f"{arg} {path}: is a symbolic link{target}; links are neither read nor "
                        "written through: give the path of the file or folder itself")


def _existing(path, arg, is_kind, noun, missing_ok=False):
    """An existing path of one kind (is_kind: stat.S_ISREG or S_ISDIR), not a link; None for a
    missing one when missing_ok."""
    p = _name(path, arg)
    st = _lstat(p, arg)
    if st is None:
        if missing_ok:
            return None
        raise PathError(f"{arg} {p}: no such {noun.split()[-1]}")
    _no_link(p, arg, st)
    if not is_kind(st.st_mode):
        raise PathError(f"{arg} {p}: is {kind_of(st.st_mode)}, not {noun}")
    return p


def input_file(path, arg, missing_ok=False):
    """A file to read: a regular file, not a link; None for a missing one when missing_ok."""
    return _existing(path, arg, stat.S_ISREG, "a regular file", missing_ok)


def input_dir(path, arg):
    """A folder to read: an existing folder, not a link to one."""
    return _existing(path, arg, stat.S_ISDIR, "a folder")


def output_file(path, arg):
    """A file to write (replace or create): absent or a regular file, not a link; its folder,
    when it exists, a folder (a missing one may be created by the tool)."""
    p = _name(path, arg)
    st = _lstat(p, arg)
    if st is not None:
        _no_link(p, arg, st)
        if not stat.S_ISREG(st.st_mode):
            raise PathError(f"{arg} {p}: is {kind_of(st.st_mode)}; only a regular file is "
                            "replaced")
    parent = p.parent
    pst = _lstat(parent, arg)
    if pst is not None and not stat.S_ISDIR(os.stat(parent).st_mode if stat.S_ISLNK(pst.st_mode)
                                            else pst.st_mode):
        raise PathError(f"{arg} {p}: {parent} is not a folder")
    return p


def output_dir(path, arg):
    """A folder to write into: absent (the tool makes it) or a folder, not a link."""
    p = _name(path, arg)
    st = _lstat(p, arg)
    if st is not None:
        _no_link(p, arg, st)
        if not stat.S_ISDIR(st.st_mode):
            raise PathError(f"{arg} {p}: is {kind_of(st.st_mode)}, not a folder")
    return p


def read_bytes(path, arg, limit=MAX_READ):
    """The bytes of a regular file, read without following a link or blocking on a FIFO, and at
    most `limit` of them (a larger file is refused)."""
    p = _name(path, arg)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ELOOP:
            st = _lstat(p, arg)
            if st is not None:
                _no_link(p, arg, st)
        if e.errno == errno.ENOENT:
            raise PathError(f"{arg} {p}: no such file") from None
        raise PathError(f"{arg} {p}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathError(f"{arg} {p}: is {kind_of(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise PathError(f"{arg} {p}: is {st.st_size} bytes, more than the {limit} this "
                            "tool reads")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        chunks, size = [], 0
        while True:
            try:
                b = os.read(fd, 1 << 20)
            except OSError as e:
                raise PathError(f"{arg} {p}: {e.strerror}") from None
            if not b:
                break
            size += len(b)
            if size > limit:
                raise PathError(f"{arg} {p}: more than the {limit} bytes this tool reads")
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path, arg, limit=MAX_READ):
    """read_bytes as UTF-8 text; a byte-order mark at the start is dropped."""
    data = read_bytes(path, arg, limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PathError(f"{arg} {path}: not UTF-8 text (byte {e.start})") from None


def _umask():
    old = os.umask(0)
    os.umask(old)
    return old


class Staged:
    """Outputs written first, published together: add() writes each to a temporary beside its
    target (fsync'ed), publish() renames them all into place; a failure before publish() (or
    leaving the `with` block by an exception) removes every temporary and changes no output.

        with Staged() as out:
            out.add(path, text, "--readme")
            ...
            out.publish()
    """

    def __init__(self):
        self.items = []  # (temporary, target, arg)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.discard()
        return False

    def targets(self):
        return [target for _, target, _ in self.items]

    def add(self, path, data, arg):
        path = output_file(path, arg)
        if isinstance(data, str):
            data = data.encode("utf-8")
        st = _lstat(path, arg)
        mode = (st.st_mode & 0o777) if st is not None else (0o666 & ~_umask())
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        except OSError as e:
            raise PathError(f"{arg} {path}: cannot write in {path.parent}: {e.strerror}") from None
        self.items.append((tmp, path, arg))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
        except OSError as e:
            raise PathError(f"{arg} {path}: cannot write: {e.strerror}") from None
        return path

    def publish(self):
        """Renames every temporary over its target. A target that became a link, a folder or
        another non-regular file meanwhile is refused before any rename."""
        for _, path, arg in self.items:
            output_file(path, arg)
        folders = set()
        while self.items:
            tmp, path, arg = self.items[0]
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise PathError(f"{arg} {path}: cannot replace: {e.strerror}") from None
            self.items.pop(0)
            folders.add(path.parent)
        for folder in folders:
            _sync_dir(folder)

    def discard(self):
        for tmp, _, _ in self.items:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.items = []


def _sync_dir(folder):
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path, data, arg):
    """Replaces (or creates) one file by the rename of a temporary written beside it."""
    with Staged() as out:
        out.add(path, data, arg)
        out.publish()


@contextlib.contextmanager
def folder_lock(folder, arg):
    """An exclusive flock(2) of a folder for the length of the block: the lock every writer of a
    results file in that folder takes (the C++ writers too)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise PathError(f"{arg} {folder}: cannot lock the folder: {e.strerror}") from None
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                break
            except InterruptedError:
                continue
        yield
    finally:
        os.close(fd)  # releases the lock


def merge_csv(path, arg, header, lines, check_first=None):
    """Appends `lines` (whole CSV lines, each ending in a newline) to the results file `path`
    under the lock of its folder: the file is read as it is at that moment (a new or empty file
    gets `header`), its first line given to check_first (which raises PathError to refuse it),
    and the old text plus the new lines renamed over it. Returns True if the file was new."""
    path = output_file(path, arg)
    folder = path.parent if str(path.parent) else Path(".")
    with folder_lock(folder, arg):
        st = _lstat(path, arg)
        old = read_text(path, arg) if st is not None else ""
        new = old == ""
        if new:
            text = header + "\n"
        else:
            first = old.split("\n", 1)[0].rstrip("\r")
            if check_first is not None:
                check_first(first)
            text = old if old.endswith("\n") else old + "\n"
        write_atomic(path, text + "".join(lines), arg)
    return new


# ---------------------------------------------------------------------------------------------
# Text from a CSV file, a log or the environment, written into a Markdown table: it may end the
# cell (|), the row (a newline), open a code span (`), emphasis (* _ ~), a link ([ ]), an HTML
# tag or entity (< > &). Every tool that writes Markdown from such text passes it through these.

_MD_SPECIAL = "\\`*[]<>&|~"


def _one_line(text):
    return "".join(" " if (ord(c) < 0x20 or ord(c) == 0x7f) else c for c in str(text))


def md_text(text):
    """Plain text for a Markdown table cell or heading: control characters (newlines) become
    spaces, Markdown's special characters are backslash-escaped (an underscore only where it
    could open or close emphasis)."""
    text = _one_line(text)
    out = []
    for i, c in enumerate(text):
        # _ inside a word (dropout0.5_causal) emphasises nothing: left as it is
        inner = c == "_" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and \
            text[i + 1].isalnum()
        out.append("\\" + c if c in _MD_SPECIAL or (c == "_" and not inner) else c)
    return "".join(out)


def md_code(text):
    """A code span for a Markdown table cell: control characters become spaces, a backtick
    (which would end the span) becomes ', and | is escaped (GFM ends a cell at | even there)."""
    return "`" + _one_line(text).replace("`", "'").replace("|", "\\|") + "`"


def md_target(path):
    """A link target: a path with spaces, brackets and the like percent-encoded."""
    from urllib.parse import quote
    return quote(_one_line(path), safe="/._-~:+,=@")


def missing_folders(folder):
    """The folders, outermost first, that making `folder` (with its parents) would create: what
    a tool removes again when it fails, so that it leaves no folder it made."""
    missing = []
    folder = Path(folder).absolute()
    while not os.path.lexists(folder):
        missing.insert(0, folder)
        folder = folder.parent
    return missing
