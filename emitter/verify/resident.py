"""The module's weights, resident only while an op reads them.

model.py's `load_weights` hands the module copy-on-write maps of the weight files (no copy in
memory), but a map whose pages were read stays resident: after one forward pass the process holds
every weight, beside the VM's blocks and the interpreter. The lock lets go of a weight's pages
after each op that reads it (madvise DONTNEED: they stay in the page cache and come back on the
next touch), so its peak is one op's weights, not the model's.

Only pages that still hold the file are let go: a page the module wrote to (copy-on-write made it
its own) is kept, and that weight is never let go again, so a module that writes into its weights
behaves under the lock exactly as it does for a user. Linux only (/proc/self/maps and pagemap);
elsewhere nothing is let go.
"""

import contextlib
import ctypes
import ctypes.util
import functools
import inspect
import mmap
import os
import sys
import threading
import time


PAGE = mmap.PAGESIZE
# a pagemap entry's top byte (bit 63 present, 62 swapped, 61 file-backed or shared): whether that
# page is the process's own (present and not the file's: copy-on-write copied it; or swapped out),
# as a byte table: each top byte translated to 1 if so, else 0
_OWN = bytes(int(bool(b & 0x40) or (b & 0xA0) == 0x80) for b in range(256))
_TOP = 7 if sys.byteorder == "little" else 0   # the top byte of each 8-byte (native) entry


def _file_maps(paths=None):
    """[(start, end, offset in the file, the file's path)] of this process's file-backed mappings
    (of the files `paths` names, when given: the other lines, torch's libraries, are not parsed)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            at = line.find(" /")
            if at < 0 or (paths is not None and line[at + 1:].rstrip("\n") not in paths):
                continue
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[4] != "0":
                start, end = parts[0].split("-")
                out.append((int(start, 16), int(end, 16), int(parts[2], 16), parts[5].rstrip("\n")))
    return out


def held_for_writing(paths):
    """Those of `paths` (real paths) this process holds open for writing: a shared writable map of
    it, or a descriptor opened to write (Linux's /proc; elsewhere none is known)."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and "w" in parts[1] and "s" in parts[1] and parts[5].rstrip("\n") in paths:
                    found.add(parts[5].rstrip("\n"))
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target in paths:
                    with open(f"/proc/self/fdinfo/{fd}") as f:
                        flags = next(int(x.split()[1], 8) for x in f if x.startswith("flags:"))
                    if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                        found.add(target)
            except (OSError, StopIteration, ValueError):
                continue
    except OSError:
        pass
    return found


# weights folders watched while a bundle runs (real path -> [its Watching]): Python's
# audit hook (one per process, added at the first watch) sees every open to write and every
# change of a folder's entries made through Python's own functions, whoever asks for it: the
# bundle's code, numpy's memmap
_WATCHED = {}
_WATCH_LOCK = threading.Lock()
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
# the other audited calls that change a weights folder: event -> the paths it names, each (the
# index of its path among the event's arguments, of its dir_fd ("cwd": none), whether the call
# follows a link there, whether it makes the entry)
_CHANGES = {
    "os.rename": ((0, 2, False, False), (1, 3, False, False)),   # (src, dst, src_dir_fd, dst_dir_fd)
    "os.remove": ((0, 1, False, False),),                        # (path, dir_fd)
    "os.rmdir": ((0, 1, False, False),),                         # (path, dir_fd)
    "os.truncate": ((0, "cwd", True, False),),                   # (path or descriptor, length)
    "os.link": ((0, 2, True, False), (1, 3, False, True)),       # (src, dst, src_dir_fd, dst_dir_fd)
    "os.symlink": ((1, 2, False, True),),                        # (src, dst, dir_fd)
    "os.mkdir": ((0, 2, False, True),),                          # (path, mode, dir_fd)
    "os.chmod": ((0, 2, True, False),),                          # (path, mode, dir_fd)
}


def _audit(event, args):
    if not _WATCHED or (event != "open" and event not in _CHANGES):
        return
    if event == "open":   # (path, mode, flags); os.open's mode is None and its dir_fd unsaid
        path, mode, flags = (tuple(args) + (None, None))[:3]
        if not (flags & _WRITE_FLAGS if isinstance(flags, int) else any(c in str(mode or "") for c in "wax+")):
            return
        creates = isinstance(flags, int) and bool(flags & os.O_CREAT)
        named = [(path, None if mode is None else "cwd", True, creates)]
    else:   # (a descriptor, `os.chmod(fd)`, `os.truncate(fd)`: the file it is open on)
        named = [(_fd_path(args[p]), d if d == "cwd" else args[d], follow, creates)
                 for p, d, follow, creates in _CHANGES[event]]
    with _WATCH_LOCK:
        watches = [w for ws in _WATCHED.values() for w in ws]
    roots = sorted({w.root for w in watches})
    for path, dir_fd, follow, creates in named:
        for real, sure in _places(path, dir_fd, follow, creates, roots):
            if creates and event != "open" and os.path.lexists(real):   # (it will fail: nothing made;
                continue                                                # `os.makedirs(w, exist_ok=True)`)
            for w in watches:
                if (real == w.root or real.startswith(w.root + os.sep) or real in w.files) \
                        and not _own(w, real, creates):
                    (w.opened if sure else w.maybe).add(real)   # (a set's add: atomic under the GIL)


def _fd_path(path):
    """An audited call's path; for a descriptor, the file it is open on (None: not one of ours)."""
    if not isinstance(path, int):
        return path
    try:
        return os.readlink(f"/proc/self/fd/{path}")
    except OSError:
        return None


def _own(w, real, creates):
    """Whether `real` is the lock's own (`w.own`, its store of traces): in it, or a folder it makes
    on the way to it."""
    return bool(w.own) and ((real + os.sep).startswith(w.own + os.sep)
                            or creates and (w.own + os.sep).startswith(real + os.sep))


def _places(path, dir_fd, follow, creates, roots):
    """[(path, sure)] an audited call may name, their folders resolved (and, where the call
    `follow`s a link, the file too): a relative one in the folder its descriptor names, else from
    the current folder; where the folder is unsaid (os.open's dir_fd), the current folder's and
    any watched folder's that holds the name: sure where the current folder has no such file to
    open (so another folder's it was), else not (`maybe`: blamed only where that file changed)."""
    if path is None or isinstance(path, int):
        return ()
    p = os.fsdecode(path)
    if os.path.isabs(p):
        out = [(p, True)]
    elif isinstance(dir_fd, int) and dir_fd >= 0:   # (none given: AT_FDCWD, below zero)
        try:
            out = [(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), p), True)]
        except OSError:
            out = [(os.path.join(root, p), False) for root in roots if os.path.lexists(os.path.join(root, p))]
    elif dir_fd is None:
        elsewhere = not creates and not os.path.lexists(p)
        out = [(os.path.abspath(p), True)] + [(os.path.join(root, p), elsewhere) for root in roots
                                               if os.path.lexists(os.path.join(root, p))]
    else:
        out = [(os.path.abspath(p), True)]
    out = [(os.path.realpath(x) if follow else os.path.join(os.path.realpath(os.path.dirname(x)), os.path.basename(x)), sure)
           for x, sure in out]
    return [(r, sure) for r, sure in out if f"{os.sep}__pycache__{os.sep}" not in r]


class Watching:
    """The files under a weights folder (and `files`, those the check read, wherever their links
    lead) that this process opens to write, truncates, removes, renames, links, makes or chmods
    through Python from now until `stop()` (`opened`; `maybe`, where the call did not say which
    folder; `own`: a folder of the lock's own writes, not counted): a bundle reads its weights only. Any thread's calls count (the lock's process runs one check at a time; the
    checks of a Dask worker's threads share the blame of one that writes into a folder they watch);
    a call that does not go through Python's own functions (torch.save's and torch.from_file's C++,
    C's open) is not seen."""
    _hooked = []

    def __init__(self, folder, own=None, files=()):
        self.opened, self.maybe, self.root = set(), set(), None
        self.own = own and os.path.realpath(own)
        self.files = {os.path.realpath(f) for f in files}
        if folder is None:
            return
        if not Watching._hooked:
            sys.addaudithook(_audit)   # (for the life of the process: a hook cannot be taken out)
            Watching._hooked.append(True)
        self.root = os.path.realpath(folder)
        with _WATCH_LOCK:
            _WATCHED.setdefault(self.root, []).append(self)

    def stop(self):
        with _WATCH_LOCK:
            left = [w for w in _WATCHED.get(self.root, []) if w is not self]
            if left:
                _WATCHED[self.root] = left
            else:
                _WATCHED.pop(self.root, None)
        return self.opened


RELEASE_FROM = 16 << 20   # weights of fewer bytes are not worth a look at the maps (1 ms a check)


def worth_releasing(values):
    """Whether the leaves `values` (the VM's arrays) take enough memory to let their pages go."""
    return sum(getattr(v, "nbytes", 0) for v in values.values()) >= RELEASE_FROM


@functools.lru_cache(maxsize=None)
def _libc():
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return lib


class Resident:
    """The module's leaf buffers that map a file, and `release(names)` to let their pages go;
    `files`: the real paths of the files the leaves can map (the weights'), else any file; none:
    nothing is let go."""

    def __init__(self, model, names, files=None):
        self.ranges, self.kept, self.seconds, self._pagemap = {}, set(), 0.0, None
        self.files = {}   # leaf: (the file it maps, the byte of the file its values start at)
        self.spans = {}   # leaf: (its first byte in memory, its size): the buffer that was found
        if files is not None and not files:   # no file to let go of
            return
        try:
            maps, self._libc = _file_maps(files), _libc()
            self._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
        except (OSError, AttributeError):
            return
        for name in names:
            t = getattr(model, "leaf_" + name, None)
            if t is None or not t.is_contiguous() or t.numel() == 0:
                continue
            lo = t.data_ptr()
            hi = lo + t.numel() * t.element_size()
            vma = next(((s, e, o, p) for s, e, o, p in maps if s <= lo and hi <= e), None)
            if vma is not None:   # pages wholly inside this file's map (it maps nothing else)
                self.ranges[name] = (max(vma[0], lo - lo % PAGE), min(vma[1], -(-hi // PAGE) * PAGE))
                self.files[name] = (vma[3], vma[2] + lo - vma[0])
                self.spans[name] = (lo, hi - lo)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._pagemap is not None:
            os.close(self._pagemap)
        self._pagemap, self.ranges, self.files, self.spans = None, {}, {}, {}

    def _written(self, name):
        """Whether a page of the leaf's map is the module's own (written to, or swapped out)."""
        lo, hi = self.ranges[name]
        n = (hi - lo) // PAGE
        return 1 in os.pread(self._pagemap, 8 * n, 8 * (lo // PAGE))[_TOP::8].translate(_OWN)

    def maps_as(self, name, path, offset, tensor):
        """Whether `tensor`, the module's leaf `name`, is still the buffer found at the start and
        an untouched map of the bytes of `path` from `offset` on (every page of it still the
        file's): then it holds those bytes, unread. (A leaf the module rebound, or whose .data
        it swapped, is another buffer.)"""
        where = self.files.get(name)
        if where is None or name in self.kept or where[1] != offset or \
                self.spans.get(name) != (tensor.data_ptr(), tensor.numel() * tensor.element_size()):
            return False
        try:
            same = os.path.samefile(where[0], path)
        except OSError:
            return False
        return same and not self._written(name)

    def release(self, names):
        start = time.perf_counter()
        for name in names:
            r = self.ranges.get(name)
            if r is None or name in self.kept:
                continue
            if self._written(name):
                self.kept.add(name)   # written to: copy-on-write made those pages the module's own
                continue
            lo, hi = r
            self._libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED)
        self.seconds += time.perf_counter() - start


def reads(program):
    """{stage index: the leaves whose storage the stage reads}, through views (a transposed table
    reads the table)."""
    leaves, alias, out = set(program.leaves), {}, {}
    for st in program.stages:
        read = set()
        for x in st.inputs:
            read |= alias.get(x, {x} & leaves)
        out[st.index] = sorted(read)
        if st.op.view:
            alias[st.out] = read
    return out


class Releasing:
    """A tap hook: `hook`'s (the probe's, or none), then the stage's weights let go; `last`: the
    last stage tapped."""

    def __init__(self, hook, resident, stage_reads):
        self.hook, self.resident, self.reads = hook, resident, stage_reads
        self.last = -1

    def __call__(self, index, value):
        if self.hook is not None:
            value = self.hook(index, value)
        self.last = index
        self.resident.release(self.reads.get(index, ()))
        return value


@contextlib.contextmanager
def as_a_user_runs(model, resident, stage_reads):
    """The free pass: the module's `probe` None and nothing of the lock's on it, as in a user's run
    (a forward that computes otherwise when no hook is set is judged on what a user gets). Only
    where there are weights to let go (a big model's maps) is a `tap` of the instance's put before
    the class's plain one, to let each stage's go after it has handed its value on; yields the
    Releasing that sees each tap then, else None."""
    model.probe = None
    own = inspect.getattr_static(type(model), "tap", None)
    if not resident.ranges or not inspect.isfunction(own) or "tap" in getattr(model, "__dict__", {"tap": 0}):
        yield None
        return
    seen, bound = Releasing(None, resident, stage_reads), own.__get__(model)

    def tap(*args, **kwargs):
        value = bound(*args, **kwargs)
        index = args[0] if args else kwargs.get("stage")
        return seen(index, value) if isinstance(index, int) else value
    model.__dict__["tap"] = tap
    try:
        yield seen
    finally:
        model.__dict__.pop("tap", None)
        model.probe = None
