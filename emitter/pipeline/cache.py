"""The shared verdict cache (`doit cache=URL`, any fsspec URL: file://, s3://, gs://, memory://).

CI has already locked exactly this bundle on exactly these weights with exactly this code: a fresh
clone takes that verdict instead of recomputing it. One object per check under its key (`keys`:
the same key every task and view of this checkout uses; for derived weights the import key, so a
hit needs no import): a hit is the key found here.

Entries are JSON and nothing else (deserialising a poisoned pickle runs code): an envelope holding
the entry as a string and its HMAC-SHA256 under the key in LOGOS_CACHE_KEY. A reader checks the
HMAC over the exact bytes before it parses the entry, and that the entry is the one asked for; a
bad, unsigned or truncated entry is a miss, said once, and recomputed (and then replaced). Entries
live under their signing key's id (an HMAC of a constant: it tells keys apart and reveals none), so
holders of another key (a stale or mistyped LOGOS_CACHE_KEY) neither see nor overwrite them: they
miss, and are told once that the cache holds another key's entries. Without LOGOS_CACHE_KEY no cache is used at all: readers and writers are those who hold
the key.
"""

import datetime
import hashlib
import hmac
import json
import os
import re
import socket
import threading
import uuid

from ..extras import require
from ..files import open_regular, write_atomic
from .digests import canonical
from .guards import say_once
from .log import LOG

SCHEMA, VERSION = "logos.verdict-cache", 1
KEY_ENV = "LOGOS_CACHE_KEY"
MAX_ENTRY = 128 << 20       # a hostile cache cannot make a reader load more than this
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')   # a JSON string (an entry's body is one)
CACHEABLE = ("pass", "fail")   # an error says something about the run, not about the inputs


class CacheError(Exception):
    """A cache URL that cannot be used (no such fsspec protocol, a bad URL): one line."""


class _Down(Exception):
    """The store failed to answer once this run: it is not asked again."""


_RUN = None


def run_info():
    """This run, as the cache records who wrote an entry: CI's run URL when there is one."""
    global _RUN
    if _RUN is None:
        env = os.environ
        run = env.get("LOGOS_RUN_ID")
        if not run and env.get("GITHUB_RUN_ID"):
            run = (f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/"
                   f"{env.get('GITHUB_REPOSITORY', '?')}/actions/runs/{env['GITHUB_RUN_ID']}")
        _RUN = {"run": run or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                "host": socket.gethostname(),
                "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return _RUN


REACH_S = 20   # how long the store may take to answer the run's first question


class VerdictCache:
    """Signed JSON entries under `url`, one per key (`<url>/<key id>/<key[:2]>/<key>.json`)."""

    def __init__(self, url, secret, say=None):
        if url.partition("://")[0] in ("s3", "s3a"):   # (fsspec is always there: build/store/)
            require("s3fs", "cache", f"cache={url}", CacheError)
        try:
            import fsspec
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError, OSError) as e:
            raise CacheError(f"cache={url}: cannot be used ({type(e).__name__}: {e})") from None
        self.url, self.secret = url, secret.encode("utf-8")
        self._local = type(self.fs).__name__ == "LocalFileSystem"   # (fsspec's, for file://)
        self.root = self.root.rstrip("/")
        self._said, self._lock = set(), threading.Lock()
        # what this run already checked: keys known to hold a valid entry, and the entries that
        # `has` verified and `get` has not yet taken (a derived program's lookup, then its lock),
        # so no entry is read and verified twice in a run
        self._valid, self._checked = set(), {}
        self._say = say or LOG.warning
        self.key_id = hmac.new(self.secret, b"logos.verdict-cache key id", hashlib.sha256).hexdigest()[:16]
        self._looked = False   # (whether the first miss looked for another key's entries)
        self._down = False     # (a store that failed to answer: not asked again this run)

    def path(self, key):
        return f"{self.root}/{self.key_id}/{key[:2]}/{key}.json"

    def reach(self, seconds=REACH_S):
        """Ask the store once, before any task, so a cache that cannot be used (no credentials, no
        such bucket, a file, nobody answering in `seconds`) refuses the run instead of failing its
        locks one by one. A folder not made yet is an empty cache (its first entry makes it); a
        bucket is not. The cache needs list, get and put on its root."""
        out = []
        asked = threading.Thread(target=lambda: out.append(self._reach()), daemon=True)
        asked.start()
        asked.join(seconds)
        if not out:
            raise CacheError(f"cache={self.url}: did not answer in {seconds} s")
        if out[0]:
            raise CacheError(f"cache={self.url}: {out[0]}")

    def _reach(self):
        """Why the store cannot be used, or None."""
        local = self.fs.root_marker == "/"
        top = None if local else self.root.split("/", 1)[0]   # an object store's bucket
        try:
            try:
                self.fs.ls(self.root, detail=False)
            except FileNotFoundError:
                if local:
                    self.fs.makedirs(self.root, exist_ok=True)
                else:
                    self.fs.ls(top, detail=False)
                return None
            if self.fs.isfile(self.root):
                return "is a file, not a folder"
        except FileNotFoundError as e:
            return (f"its bucket `{top}` does not exist (or is not this account's); make it first" if top
                    else f"cannot be made ({e})")
        except Exception as e:   # noqa: BLE001 (credentials, a refusal, a connection)
            return f"cannot be reached ({type(e).__name__}: {str(e)[:200]})"
        return None

    def _sign(self, body):
        return hmac.new(self.secret, body.encode("utf-8"), hashlib.sha256).hexdigest()

    def _bad(self, key, why):
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        say_once(f"cache: {self.url} entry {key[:16]}…: {why}; not used, the check is run here", self._say)

    def _other_keys(self):
        """Once, at the first miss: where the cache holds entries under other keys' ids and none
        under ours, say so (LOGOS_CACHE_KEY may not be the one its writers hold)."""
        with self._lock:
            if self._looked:
                return
            self._looked = True
        try:
            ids = {p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)}
        except (OSError, ValueError):
            return
        others = sorted(i for i in ids if len(i) == 16 and all(c in "0123456789abcdef" for c in i))
        if others and self.key_id not in others:
            say_once(f"cache: {self.url} holds entries signed with another LOGOS_CACHE_KEY (key id "
                     f"{', '.join(others[:3])}), none with this one (key id {self.key_id}): is it "
                     "the key the cache's writers hold? Every check is run here", self._say)

    def _within(self, fn):
        """fn()'s value, from a store that answers within REACH_S seconds (a folder's at once). One
        that does not is not asked again this run, said once: each read retried for minutes (s3fs's
        and botocore's retries on a stalled or closed connection), check by check."""
        if self._down:
            raise _Down()
        if self._local:
            return fn()
        out = []

        def asked():
            try:
                out.append((True, fn()))
            except BaseException as e:   # noqa: BLE001 (handed back to the caller)
                out.append((False, e))
        t = threading.Thread(target=asked, daemon=True)
        t.start()
        t.join(REACH_S)
        if not out:   # (a connection closed at once is retried for minutes by s3fs and botocore too)
            self._down = True
            say_once(f"cache: {self.url} did not answer in {REACH_S:g} s: not used for the rest of this run; every "
                     "check left is run here", self._say)
            raise _Down()
        if out[0][0]:
            return out[0][1]
        raise out[0][1]

    def _read(self, key):
        """The raw entry, or None when there is none (or it cannot be read)."""
        p = self.path(key)

        def read():   # (a folder's entry opened without waiting: a FIFO in its place is no entry)
            with (open_regular(p) if self._local else self.fs.open(p, "rb")) as f:
                return f.read(MAX_ENTRY + 1)
        try:
            data = self._within(read)
        except _Down:
            return None
        except FileNotFoundError:
            self._other_keys()
            return None
        except Exception as e:   # noqa: BLE001 (a store's client raises its own: botocore's credentials)
            self._bad(key, f"could not be read ({type(e).__name__}: {str(e)[:200]})")
            return None
        if len(data) > MAX_ENTRY:
            self._bad(key, f"over {MAX_ENTRY >> 20} MiB")
            return None
        return data

    def verified(self, key, data):
        """The entry's `result` when `data` is a whole entry signed with our key for `key`, else
        the reason it is not (a str)."""
        try:
            text = data.decode("utf-8")
            if len(_STRINGS.sub('""', text)) > 512:   # what is not a string: an envelope's few keys (a
                return "not a verdict-cache entry"      # body of 40M empty objects took 3.4 GB to parse)
            envelope = json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError):
            return "not JSON (truncated or not an entry)"
        if not isinstance(envelope, dict) or envelope.get("schema") != SCHEMA:
            return "not a verdict-cache entry"
        body, mac = envelope.get("body"), envelope.get("hmac")
        if not isinstance(body, str) or not isinstance(mac, str):
            return "unsigned"
        if not hmac.compare_digest(self._sign(body), mac):
            return "its signature does not match (tampered with, or signed with another key)"
        try:
            entry = json.loads(body)
        except (ValueError, RecursionError):
            return "signed, but its body is not JSON"
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("result"), dict):
            return "signed for another key"
        if entry["result"].get("verdict") not in CACHEABLE:
            return "holds no verdict"
        return entry

    def _entry(self, key):
        """The verified entry under `key`, or None (a miss; a bad entry is said once)."""
        with self._lock:
            entry = self._checked.pop(key, None)
        if entry is not None:
            return entry
        data = self._read(key)
        if data is None:
            return None
        entry = self.verified(key, data)
        with self._lock:
            (self._valid.discard if isinstance(entry, str) else self._valid.add)(key)
        if isinstance(entry, str):
            self._bad(key, entry)
            return None
        return entry

    def get(self, key, environment=None):
        """The cached verdict for `key`, marked as such, or None (a miss; a bad entry is said once).
        `environment`: the digest the key names, which the verdict must record as its own (one a
        writer computed elsewhere is not this key's, however it is signed)."""
        entry = self._entry(key)
        if entry is None or not self._keyed(key, entry, environment):
            return None
        r = entry["result"]
        r["from_cache"] = True
        r["cache"] = {"url": self.url, "key": key, "written_by": entry.get("written_by")}
        return r

    def _keyed(self, key, entry, environment):
        """Whether a verified entry's verdict records `key` and `environment` (the digest the key
        names; None: not asked) as its own: one a writer computed elsewhere is not this key's,
        however it is signed (said once)."""
        r = entry["result"]
        if environment is None or (r.get("key") == key and (r.get("hashes") or {}).get("environment") == environment):
            return True
        self._bad(key, "signed, but its verdict records another key or environment than its key names")
        return False

    def has(self, key, environment=None):
        """A valid entry is there that `get(key, environment)` takes (a bad one is not, and is said
        once); asked once per run."""
        with self._lock:
            if key in self._valid and environment is None:
                return True
        entry = self._entry(key)
        if entry is None or not self._keyed(key, entry, environment):
            return False
        with self._lock:
            self._checked[key] = entry
        return True

    def listed(self):
        """The keys this key's folder holds an entry under, by name (one listing), or None where it
        cannot be listed."""
        try:
            names = self._within(lambda: self.fs.find(f"{self.root}/{self.key_id}"))
        except Exception:   # noqa: BLE001 (a store's client raises its own)
            return None
        return {n.rsplit("/", 1)[-1][:-len(".json")] for n in names if n.endswith(".json")}

    def put(self, key, result):
        """Publish `result` under `key` (signed; staged under a temporary name, then moved)."""
        if result.get("verdict") not in CACHEABLE:
            return False
        r = {k: v for k, v in result.items() if k not in ("from_cache", "cache")}
        body = canonical({"key": key, "written_by": run_info(), "result": r})
        data = canonical({"schema": SCHEMA, "version": VERSION, "hmac": self._sign(body), "body": body})
        p = self.path(key)
        tmp = f"{p}.{uuid.uuid4().hex[:12]}.partial"

        def publish():
            self.fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(tmp, data.encode("ascii"))
            if self.fs.isdir(p):   # a folder in the entry's place: moved into, it would stay there
                self.fs.rm(p, recursive=True)
            self.fs.mv(tmp, p)
        try:
            self._within(publish)
        except _Down:
            return False
        with self._lock:
            self._valid.add(key)
        return True


class LocalStore(VerdictCache):
    """build/store/: every keyed pass and fail of this checkout under its key, in the shared
    cache's entry format (signed with a secret of this build/, made on first use): a check whose
    inputs come back to an earlier key takes its verdict from here, and `cache=URL` mirrors the
    same keys. Its verdicts are this checkout's own: not marked as cached."""

    def __init__(self, build):
        secret_path = os.path.join(build, "store", ".secret")
        secret = None
        try:
            with open(secret_path, encoding="ascii") as f:
                secret = f.read().strip() or None
        except OSError:
            pass
        if secret is None:
            secret = uuid.uuid4().hex
            write_atomic(secret_path, secret)
        super().__init__("file://" + os.path.abspath(os.path.join(build, "store")), secret)

    def get(self, key):
        entry = self._entry(key)
        return None if entry is None else entry["result"]

    def _other_keys(self):
        """(A new secret of build/ leaves the old entries behind: nothing to say of them.)"""


def open_cache(url, env=None, say=None, reach=True):
    """(VerdictCache or None, a warning or None): no URL, no cache; a URL without the key in
    LOGOS_CACHE_KEY is not used (a reader without the key must not trust entries it cannot check);
    CacheError for a URL that names no location (`file://`, `s3://`, `::`), which fsspec would
    take for the current folder."""
    if not url:
        return None, None
    scheme, sep, where = url.partition("://")
    if not (sep and scheme.isidentifier() and where.strip("/")) or "::" in url:
        raise CacheError(f"cache={url}: names no location; give a URL with a folder or bucket, "
                         "e.g. cache=file:///srv/logos-cache or cache=s3://BUCKET/PREFIX")
    secret = (os.environ if env is None else env).get(KEY_ENV)
    if not secret:
        return None, (f"cache={url}: {KEY_ENV} is not set, so the cache is not used (neither read "
                      "nor written); set it to the key CI signs with")
    found = VerdictCache(url, secret, say)
    if reach:
        found.reach()
    return found, None


_STORES = {}
_STORES_LOCK = threading.Lock()


def store(url):
    """The run's cache for `url` (one per process, so a bad entry is said once), or None."""
    if not url:
        return None
    with _STORES_LOCK:
        if url not in _STORES:
            _STORES[url] = open_cache(url, reach=False)[0]   # (the run asked it once, before any task)
        return _STORES[url]
