"""What a run publishes to the shared verdict cache (docs/SCALE.md): each current pass or fail,
as the lock wrote it, computed here in the environment its key names, once (the `cache` task)."""

import sys

from ..files import read_json
from ..fingerprint import sha256_or_none
from .cache import CACHEABLE, store
from .keys import check_key, check_parts, lock_records
from .log import LOG


def publishable(r, parts):
    """Whether the result `r` may be published under the key of `parts`: a pass or fail recorded
    under exactly that key, computed here in the environment the key names (a Dask worker
    elsewhere computed it in its own; one taken from a cache is that cache's, its run named there,
    never published again as this run's)."""
    return (isinstance(r, dict) and r.get("verdict") in CACHEABLE and parts is not None
            and not r.get("from_cache")
            and r.get("key") == check_key(parts)
            and (r.get("hashes") or {}).get("environment") == parts["environment"])


def as_written(path, record):
    """The result at `path` where its file is the one the lock wrote (`record`: what the lock
    status holds of it, its sha256, key and verdict), else None: a result edited since, by hand or
    by a restore, is nobody's verdict to share."""
    if not isinstance(record, dict) or sha256_or_none(path) != record.get("sha256"):
        return None
    r = read_json(path)
    return r if r is not None and (r.get("key"), r.get("verdict")) == (record.get("key"), record.get("verdict")) \
        else None


def publish_all(entries, threads, url):
    """The `cache` task: publish every current pass/fail verdict the cache lacks, including those
    of locks that did not rerun (a no-op over a restored build/ fills a new cache). What the cache
    holds is listed once a run (a cache emptied or pruned since the last run is filled again); a
    key listed there is not sent again (a bad entry is replaced when its check runs here)."""
    cache = store(url)
    if cache is None:
        return True
    held, sent, failed = cache.listed(), 0, []
    for e in entries:
        status, wrote = read_json(e.status), lock_records(read_json(e.lock_status))
        for c in e.checks:
            r = as_written(c.result, wrote.get(c.dtype))
            ran = (r.get("execution") or {}).get("threads") if isinstance(r, dict) else None
            if not publishable(r, check_parts(e, c, status, ran)) or (held is not None and r["key"] in held):
                continue
            try:
                if held is not None or not cache.has(r["key"], (r.get("hashes") or {}).get("environment")):
                    cache.put(r["key"], r)
                    sent += 1
            except Exception as x:   # the verdicts stand; the cache is best effort
                failed.append(f"{c.result}: {type(x).__name__}: {str(x)[:200]}")
    if sent:
        sys.stdout.write(f"cache: published {sent} verdict(s) to {url}\n")
    for f in failed[:5]:
        LOG.warning(f"cache: not published: {f}")
    return True
