"""The one atomic writer (temporary file, then rename), tolerant JSON reads, a JSON cache of values
derived from files, and the bundle's file names: standard library only, so the dodo and the
pipeline use them without loading numpy."""

import os

BUNDLE_FILES = ("model.py", "manifest.json", "compile.py")
PARTIAL = ".partial"   # a file being written: renamed into place when whole, else swept later


def _stage(directory, fname, data):
    """`data` in full in a temporary file beside `fname`, readable like any emitted file. `data` is
    text, bytes, or an array that writes itself (`tofile`: a large leaf is never copied to bytes)."""
    import tempfile   # (json too, where used: a `logos check` that writes nothing never loads them)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{fname}.", suffix=PARTIAL)
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(data, "tofile"):
                try:
                    data.tofile(f)
                except OSError as e:
                    if e.errno is not None:
                        raise
                    import errno   # numpy's short write ("N requested and 0 written") names nothing
                    raise OSError(errno.ENOSPC, f"{e}: is the disk full?", os.path.join(directory, fname)) from None
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o644)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_files(directory, files):
    """Files (name -> text or bytes) into `directory`: every one staged in full, then all renamed
    into place, so a failure leaves no half-written file and nothing of a refused set (a rename
    that fails puts back what the set's earlier ones replaced). A name that is a folder is an
    IsADirectoryError naming it, before anything is written."""
    import errno
    os.makedirs(directory, exist_ok=True)
    for fname in files:
        final = os.path.join(directory, fname)
        if os.path.isdir(final):
            raise IsADirectoryError(errno.EISDIR, "is a folder, where a file is to be written", final)
    staged, kept, done = [], {}, []
    try:
        for fname, data in files.items():
            staged.append((_stage(directory, fname, data), os.path.join(directory, fname)))
        for tmp, final in staged:
            existed = os.path.lexists(final)
            if len(staged) > 1 and existed:   # the file it replaces, until all are in
                try:
                    os.link(final, tmp[:-len(PARTIAL)] + ".was" + PARTIAL)
                    kept[final] = tmp[:-len(PARTIAL)] + ".was" + PARTIAL
                except OSError:
                    pass   # (no hard links here: that one cannot be put back)
            os.replace(tmp, final)
            done.append((final, existed))
    except BaseException:
        for final, existed in reversed(done):
            try:
                if final in kept:
                    os.replace(kept[final], final)
                elif not existed:
                    os.unlink(final)
            except OSError:
                pass
        raise
    finally:
        for path in [tmp for tmp, _ in staged] + list(kept.values()):
            if os.path.lexists(path):
                os.unlink(path)


def own_folder(path):
    """`path` where a folder of the pipeline's own goes: a link in its place is removed (never what
    it leads to, which is no folder of the bundle's to clear or write into)."""
    if os.path.islink(path):
        os.unlink(path)


def remove_whatever(path):
    """Whatever is at `path` removed, never followed: a folder with what it holds; a file, a link
    or a FIFO unlinked (rmtree would open a FIFO and wait on it); nothing there is no error."""
    import shutil
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def write_atomic(path, data):
    """One file by temporary file and rename."""
    write_files(os.path.dirname(os.path.abspath(path)), {os.path.basename(path): data})


def streamed(path):
    """Whether a path a user named for an output is something written into as it is, never
    replaced: a FIFO, a terminal, /dev/stdout, a device (links followed)."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_out(path, data):
    """An output file a user named: a regular file (where a link leads, for a link) written whole
    by temporary file and rename; a FIFO, a terminal or a device written into as it is."""
    if streamed(path):
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return
    write_atomic(os.path.realpath(path) if os.path.islink(path) else path, data)


def json_lines(obj):
    """`obj` (a dict) as JSON with a key per line, and a list of dicts an item per line: what a
    diff reads line by line, written by the C encoder (indent= falls back to the pure-Python one,
    most of a warm-cache run's time when a result holds thousands of stages), one encoder for
    every item (json.dumps makes one a call: a fifth of a thousand-program report's time)."""
    import json
    encode = json.JSONEncoder(sort_keys=True, allow_nan=True, check_circular=False).encode

    def value(v):
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return "[\n" + ",\n".join("  " + encode(x) for x in v) + "\n ]"
        return encode(v)
    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(obj[k])}" for k in sorted(obj)) + "\n}\n"


MAX_JSON = 256 << 20   # no file the pipeline reads as JSON may make it hold more than this


def open_regular(path, flags=os.O_RDONLY, mode="rb"):
    """`path` opened as a file object without waiting (a FIFO planted there would block the open,
    or its first read, for good); an OSError where it is no regular file."""
    import stat
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)   # (less the umask)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            import errno
            raise OSError(errno.EINVAL, "not a regular file", path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def private(path, st=None):
    """Whether `path` (or its os.stat `st`) is this user's and writable by no one else: what code
    is run from (a kept compiled model.py) must be, and so must its folder and the zoo's build/."""
    try:
        st = st or os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def read_json(path, limit=MAX_JSON):
    """A JSON file's object, or None when it is missing, not JSON, not an object (every file the
    project reads this way is one: a status file holding `"x"` is as good as none) or over `limit`
    bytes. (os-level reads: a no-op run reads a status file per task, and file objects cost twice
    the read.)"""
    import json
    try:   # (O_NONBLOCK: a FIFO in a file's place reads as empty, never waits for a writer)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        value = json.loads(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        return value if isinstance(value, dict) else None
    except (OSError, ValueError, RecursionError, IndexError):
        return None
    finally:
        os.close(fd)


class StampedCache:
    """Values derived from files, kept between runs in one JSON file, each under its file's stamp
    (a content hash: `emitter.fingerprint` is the one stat cache): a hit needs the same stamp, what this run did not ask for
    is dropped, and the file is rewritten only when something changed. Best effort: a cache that
    cannot be read or written costs a recomputation, nothing more."""

    def __init__(self, path, version):
        self.path, self.version = path, version
        old = read_json(path) if path else None
        ok = isinstance(old, dict) and old.get("version") == version
        self.old = old["entries"] if ok and isinstance(old.get("entries"), dict) else {}
        self.new = {}

    def get(self, key, stamp):
        hit = self.old.get(key)
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == stamp:
            self.new[key] = hit
            return hit[1]
        return None

    def put(self, key, stamp, value):
        self.new[key] = [stamp, value]

    def save(self):
        if self.path and self.new != self.old:
            import json
            try:
                write_atomic(self.path, json.dumps({"version": self.version, "entries": self.new}))
            except OSError:
                pass


def size_text(n):
    """A byte count as people read it: `100 bytes`, `1.5 KiB`, `2.3 GiB` (a limit and what exceeds
    it both readable, whatever their scale)."""
    if n < 1024:
        return f"{n} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"


def unwritable(path):
    """Why the result cannot be written at `path` (where it leads, for a link: `write_out`), or None."""
    path = os.path.realpath(path) if os.path.islink(path) else path
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "is a folder, where the result file is to be written"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK):
        return f"{folder} cannot be written to"
    return None
