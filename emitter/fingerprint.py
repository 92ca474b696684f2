"""The one fingerprint rule: a file's content is its sha256, looked up through one stat cache whose
stamp is (size, mtime_ns, ctime_ns, inode). No write keeps the ctime, so an edit that puts its size
and mtime back (`cp -p`, `touch -r`, `tar x`) is hashed again; a touch or a fresh clone costs one
hash and changes nothing. Nothing else in the project remembers a file's content by its stat.

A file whose ctime is under `RACY_S` old is hashed but not remembered (git's "racily clean" rule):
a write in the same clock tick as the stat could otherwise keep the stamp and change the bytes.
The cache lives in one JSON file (build/.fingerprints.json) when `bind` names it; standard library
only, so doit's file checker, the keys and the lock share it without loading numpy.

Beside it (`.checked.json`), what a check found of bytes by their sha256 (`checked`, `remember`:
the VM's scan of a weight's values for NaN and its extremes), so a check in a later process does
not read a checkpoint again for it; loaded only by a process that asks, never by a no-op.

What no stat rule sees (git's blind spot too): a write through a shared writable map into a page
already dirty since the last stamp moves neither mtime nor ctime (the kernel updates them when a
clean page is first written). Such bytes keep their recorded sha256 until the page is written
back and written again; a key, and a kept scan, are then about the bytes the record holds."""

import atexit
import contextlib
import hashlib
import json
import os
import stat
import threading
import time

from .files import private, read_json, write_atomic

VERSION = 3
RACY_S = 2.0
CHECKED_LIMIT = 1 << 14   # findings kept (3 MB at most), the oldest dropped first


def _stamp(st):
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:"


class Fingerprints:
    """path -> sha256 through the stat cache; `save` writes what changed (best effort). An entry
    is one string, "size:mtime_ns:ctime_ns:inode:sha256" (a thousand-program zoo's cache loads in
    a third of the time lists take).

    Entries are keyed by the path as the caller names it, without resolving it against the
    working directory (the stamp holds the inode, so a relative path that names another file
    after a chdir misses, as a moved file does), except that a path inside the folder holding
    the record's build/ is keyed by its path from there, as the zoo names it: an absolute one,
    and a relative one where the record was bound from another folder (a hand lock given its
    weights by an absolute path, or run in a folder of the zoo, finds them on record)."""

    def __init__(self, path=None):
        self.path = path
        self.build = build = path and os.path.dirname(os.path.abspath(path))
        self.root = build and os.path.basename(build) == "build" and os.path.dirname(build) + os.sep
        self.away = bool(self.root) and os.path.join(os.getcwd(), "") != self.root   # (bound from elsewhere)
        old = read_json(path) if path else None
        ok = isinstance(old, dict) and old.get("version") == VERSION and isinstance(old.get("files"), dict)
        self.files = old["files"] if ok else {}
        self.dirty = False
        self._lock = threading.Lock()
        self.findings, self.found, self.private = None, False, False   # (`checked`: read when first asked)

    def _findings(self):
        if self.findings is None:   # (only from a build/ no one else can write)
            self.private = bool(self.build) and private(self.build)
            old = read_json(self.path[:-len(".json")] + ".checked.json") if self.private else None
            ok = isinstance(old, dict) and old.get("version") == VERSION and isinstance(old.get("found"), dict)
            self.findings = old["found"] if ok else {}
        return self.findings

    def checked(self, key):
        """What `remember` kept under `key` (a string naming the bytes by their sha256), or None."""
        return self._findings().get(key)

    def remember(self, key, value):
        with self._lock:
            found = self._findings()
            found.pop(key, None)
            found[key] = value
            if len(found) > CHECKED_LIMIT:   # (in one go: popping the oldest one by one is quadratic)
                self.findings = found = dict(list(found.items())[-CHECKED_LIMIT:])
            self.found = True

    def _key(self, path):
        if self.away and type(path) is str and not os.path.isabs(path):   # (`..` after a link: where it leads)
            path = os.path.realpath(path) if ".." in path else os.path.abspath(path)
        return path[len(self.root):] if self.root and type(path) is str and path.startswith(self.root) else path

    def recorded(self, path, stamp):
        hit = self.files.get(self._key(path))
        if type(hit) is str and hit.startswith(stamp) and len(hit) == len(stamp) + 64:
            return hit[len(stamp):]
        return None

    def sha256(self, path, st=None):
        """The sha256 of `path`'s bytes (links followed; `st`: its os.stat when the caller has
        it); OSError when it cannot be read. (`_stamp` and `recorded` written out: a no-op run
        makes ten of these calls per program.) Only a regular file is read: a FIFO or a device
        (/dev/zero behind a link) is an OSError, never a hang or an endless read."""
        st = st or os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:"
        key = self._key(path) if self.away else \
            path[len(self.root):] if self.root and type(path) is str and path.startswith(self.root) else path
        hit = self.files.get(key)
        if type(hit) is str and len(hit) == len(stamp) + 64 and hit.startswith(stamp):
            return hit[-64:]
        with open(path, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
            after = os.fstat(f.fileno())
        if _stamp(after) == stamp \
                and time.time() - st.st_ctime_ns / 1e9 > RACY_S:
            with self._lock:
                self.files[key] = stamp + sha
                self.dirty = True
        return sha

    def moved(self, old, new):
        """A file renamed from `old` to `new` keeps its hash on record (its stamp is unchanged; a
        lookup checks it all the same)."""
        with self._lock:
            entry = self.files.pop(self._key(old), None)
            if entry is not None:
                self.files[self._key(new)] = entry
                self.dirty = True

    def entry(self, path):
        """The entry on record for `path`, or None: what a driver hands its workers (`known`)."""
        e = self.files.get(self._key(path))
        return e if type(e) is str else None

    def known(self, entries):
        """Entries another process holds ({path: entry}: a driver's, handed to a worker with its
        job), taken where this record has none: a lookup checks the stamp against this process's
        own stat all the same, so a file that is not the same here is hashed."""
        with self._lock:
            for p, e in entries.items():
                p = self._key(p)
                if type(e) is str and p not in self.files:
                    self.files[p] = e

    def merge(self, entries):
        """Entries another process of this run added ({path: entry}: a forked pre-check's), kept
        as its own: each was recorded on a stamp that process took."""
        if entries:
            with self._lock:
                self.files.update(entries)
                self.dirty = True

    def save(self):
        if not self.path:
            return
        with self._lock:
            bodies = {self.path: {"version": VERSION, "files": self.files}} if self.dirty else {}
            if self.found and self.private:   # (one never read is never written over)
                bodies[self.path[:-len(".json")] + ".checked.json"] = {"version": VERSION, "found": self.findings}
            bodies = {p: json.dumps(b, separators=(",", ":")) for p, b in bodies.items()}
            self.dirty = self.found = False
        for path, body in bodies.items():
            try:
                write_atomic(path, body)
            except OSError:
                pass


_CURRENT = [Fingerprints()]
_BOUND = []


def bind(path):
    """Use (and later `save` to) the cache file `path` in this process (build/.fingerprints.json)."""
    if _CURRENT[0].path != path:
        _CURRENT[0] = Fingerprints(path)
        if not _BOUND:
            _BOUND.append(atexit.register(save))
    return _CURRENT[0]


@contextlib.contextmanager
def reading(path):
    """The record at `path` for this block's lookups, as a reader's (`logos results`): what it
    hashes is not saved, the run's record is left to the run, and the binding before comes back."""
    old = _CURRENT[0]
    _CURRENT[0] = Fingerprints(path)
    try:
        yield
    finally:
        _CURRENT[0] = old


def sha256(path, st=None):
    """The one fingerprint function: `path`'s sha256 through this process's stat cache (`st`: its
    os.stat, when the caller already has it)."""
    return _CURRENT[0].sha256(path, st)


def recorded(path, before=None):
    """`path`'s sha256 where the record holds it under the file's stamp now, else None: nothing
    is read (what a check may skip because it was done on those very bytes). `before`: its stat
    before the caller opened it, which must be the stat now (the bytes opened are these)."""
    try:
        stamp = _stamp(os.stat(path))
    except OSError:
        return None
    return _CURRENT[0].recorded(path, stamp) if before is None or _stamp(before) == stamp else None


def folder():
    """The folder of the record bound in this process (a zoo's build/), or None."""
    path = _CURRENT[0].path
    return os.path.dirname(path) or "." if path else None


def checked(key):
    return _CURRENT[0].checked(key)


def remember(key, value):
    _CURRENT[0].remember(key, value)


def sha256_or_none(path, st=None):
    try:
        return _CURRENT[0].sha256(path, st)
    except OSError:
        return None


def moved(old, new):
    """`old`'s hash on record is `new`'s (a file renamed, or a folder's file under its new name)."""
    _CURRENT[0].moved(old, new)


def entry(path):
    return _CURRENT[0].entry(path)


def known(entries):
    _CURRENT[0].known(entries)


def snapshot(findings=False):
    """What the record holds now: its hashes and the findings `remember` kept (`findings`: read
    from their file first, where no `checked` has read them yet: else a process that reads them
    after would take every one on file for its own)."""
    fp = _CURRENT[0]
    return dict(fp.files), dict((fp._findings() if findings else fp.findings) or {})


def added_since(before):
    """({path: entry}, {key: finding}) recorded since `snapshot` gave `before` (a forked child's,
    handed to the process it was forked from)."""
    fp, (files, found) = _CURRENT[0], before
    return ({p: e for p, e in fp.files.items() if files.get(p) != e},
            {k: v for k, v in (fp.findings or {}).items() if k not in found or found[k] != v})


def merge(added):
    """What `added_since` gave in another process of this run, kept as this one's own."""
    entries, found = added
    _CURRENT[0].merge(entries)
    for k, v in found.items():
        _CURRENT[0].remember(k, v)


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def save():
    _CURRENT[0].save()
