"""The shared verdict cache: signed JSON entries over fsspec (memory:// and file:// here), and doit
runs with `cache=URL`: CI's verdicts reach a fresh clone (derived weights not even imported), a
no-op run over a restored build/ fills a new cache, and a tampered, truncated or unsigned entry
is a miss, said once, then recomputed and replaced; another key's entries are never seen nor
overwritten."""

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from test_pipeline import FAKE_IMPORTER, PROG_A, PROG_B, _weights, doit, make_zoo

pytest.importorskip("fsspec")
from emitter.pipeline import cache as vc  # noqa: E402
from emitter.pipeline.keys import check_key  # noqa: E402
from emitter.pipeline.publish import publish_all  # noqa: E402

KEY = "a" * 64


def _result(verdict="pass", **extra):
    return {"verdict": verdict, "output": {"max_abs": 1e-17, "nmse": float("nan")}, "stages": [1, 2],
            "hashes": {"source": "s"}, **extra}


@pytest.fixture(params=["memory", "file"])
def store(request, tmp_path):
    url = f"memory://logos-test-{os.getpid()}-{id(request)}" if request.param == "memory" \
        else (tmp_path / "cache").as_uri()
    said = []
    c = vc.VerdictCache(url, "sekrit", said.append)
    c.said = said
    return c


def test_an_entry_comes_back_as_a_cached_verdict(store):
    assert store.get(KEY) is None and not store.has(KEY)
    assert store.put(KEY, _result())
    assert store.has(KEY)
    r = store.get(KEY)
    assert r["verdict"] == "pass" and r["stages"] == [1, 2] and math.isnan(r["output"]["nmse"])
    assert r["from_cache"] is True and r["cache"]["url"] == store.url and r["cache"]["key"] == KEY
    assert r["cache"]["written_by"] == vc.run_info()
    # what was cached about a cached verdict is not cached again
    assert store.put("b" * 64, r) and "cache" not in json.loads(json.loads(
        store.fs.cat_file(store.path("b" * 64)))["body"])["result"]
    assert not store.put("c" * 64, _result("error")) and not store.has("c" * 64)
    assert store.said == []


def _rewrite(store, key, fn):
    p = store.path(key)
    store.fs.pipe_file(p, fn(store.fs.cat_file(p)))


def test_bad_entries_are_misses_said_once(store):
    def tamper(data):
        env = json.loads(data)
        env["body"] = env["body"].replace('"pass"', '"fail"')
        return json.dumps(env).encode()

    def unsigned(data):
        env = json.loads(data)
        del env["hmac"]
        return json.dumps(env).encode()

    cases = {"tampered": (tamper, "signature does not match"),
             "truncated": (lambda d: d[: len(d) // 2], "not JSON"),
             "unsigned": (unsigned, "unsigned"),
             "pickle": (lambda d: b"\x80\x04\x95 not json", "not JSON")}
    for i, (name, (fn, why)) in enumerate(cases.items()):
        key = f"{i}" * 64
        store.put(key, _result())
        _rewrite(store, key, fn)
        assert store.get(key) is None and store.get(key) is None and not store.has(key), name
        said = [s for s in store.said if key[:16] in s]
        assert len(said) == 1 and why in said[0], (name, store.said)
    # an entry copied under another key's name
    store.put("e" * 64, _result())
    store.fs.makedirs(store.path("d" * 64).rsplit("/", 1)[0], exist_ok=True)
    store.fs.pipe_file(store.path("d" * 64), store.fs.cat_file(store.path("e" * 64)))
    assert store.get("d" * 64) is None and "signed for another key" in store.said[-1]
    # a bad entry is replaced by a good one
    store.put("0" * 64, _result())
    assert store.get("0" * 64)["verdict"] == "pass"


def test_a_fifo_or_a_device_in_an_entrys_place_is_a_miss_not_a_hang(tmp_path):
    """A folder cache's entry that is a FIFO (an open waits for a writer for ever) or a link to
    /dev/zero (128 MiB read first): a miss said once, at once; a good entry then replaces it."""
    import signal
    import time

    class Hung(RuntimeError):
        pass

    def hung(*_):
        raise Hung("the cache waited on an entry")
    said = []
    store = vc.VerdictCache((tmp_path / "cache").as_uri(), "sekrit", said.append)
    fifo, dev = "f" * 64, "9" * 64
    for key in (fifo, dev):
        os.makedirs(os.path.dirname(store.path(key)), exist_ok=True)
    os.mkfifo(store.path(fifo))
    os.symlink("/dev/zero", store.path(dev))
    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 10, 2)   # (again and again: each open that waits ends)
    try:
        start = time.monotonic()
        assert store.get(fifo) is None and store.get(dev) is None and not store.has(fifo)
        assert time.monotonic() - start < 10
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    for key in (fifo, dev):
        assert len([s for s in said if key[:16] in s and "not a regular file" in s]) == 1, said
    assert store.put(fifo, _result()) and store.get(fifo)["verdict"] == "pass"


def test_a_fifo_in_a_status_or_result_files_place_reads_as_none_at_once(tmp_path):
    """read_json (every status and result file of a run): a FIFO in a file's place is no JSON,
    said at once, never a wait for a writer."""
    import signal

    from emitter.files import read_json

    def hung(*_):
        raise RuntimeError("read_json waited on a FIFO")
    os.mkfifo(tmp_path / "float32.json")
    old = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        assert read_json(str(tmp_path / "float32.json")) is None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_another_keys_entries_are_neither_seen_nor_overwritten(store):
    """A run with a stale or mistyped LOGOS_CACHE_KEY misses (told once that the cache holds
    another key's entries) and what it publishes never replaces the right key's."""
    other = vc.VerdictCache(store.url, "the-right-key", lambda s: None)
    other.put("f" * 64, _result())
    assert store.get("f" * 64) is None and store.get("e" * 64) is None
    said = [s for s in store.said if "another LOGOS_CACHE_KEY" in s]
    assert len(said) == 1 and other.key_id in said[0] and store.key_id in said[0], store.said
    assert store.put("f" * 64, _result("fail")) and store.get("f" * 64)["verdict"] == "fail"
    assert other.get("f" * 64)["verdict"] == "pass"
    assert "the-right-key" not in other.key_id and len(other.key_id) == 16


def test_a_run_reads_and_verifies_each_entry_once(store):
    """A derived program's lookup (`has`) and then its lock (`get`), and the publishing of what
    this run wrote, do not read an entry again; a get that is not after a has reads it afresh."""
    store.put(KEY, _result())
    reads = []
    reader = vc.VerdictCache(store.url, "sekrit", store.said.append)
    real = reader._read
    reader._read = lambda key: reads.append(key) or real(key)
    assert reader.has(KEY) and reader.has(KEY) and reads == [KEY]
    r = reader.get(KEY)
    assert r["verdict"] == "pass" and r["from_cache"] and reads == [KEY]
    r["hashes"]["source"] = "changed by the lock action"
    assert reader.get(KEY)["hashes"] == {"source": "s"} and reads == [KEY, KEY]
    # what a reader published it knows is there; an entry found bad is not known any more
    assert reader.put("b" * 64, _result()) and reader.has("b" * 64) and reads == [KEY, KEY]
    _rewrite(reader, "b" * 64, lambda d: d[:10])
    assert reader.get("b" * 64) is None and not reader.has("b" * 64)
    assert reads == [KEY, KEY, "b" * 64, "b" * 64] and len(store.said) == 1


def test_no_key_no_cache():
    c, warning = vc.open_cache("memory://x", env={})
    assert c is None and "LOGOS_CACHE_KEY is not set" in warning
    assert vc.open_cache(None, env={"LOGOS_CACHE_KEY": "k"}) == (None, None)
    with pytest.raises(vc.CacheError):
        vc.VerdictCache("nosuchprotocol://x", "k")


def test_a_cache_is_asked_once_before_any_task_and_not_for_long(tmp_path, monkeypatch):
    """The run asks the store once (`open_cache`), with a deadline, and refuses one that is a file
    or a folder that cannot be made; a process's store for its locks (`store`) asks nothing more."""
    import time
    env = {"LOGOS_CACHE_KEY": "k"}
    (tmp_path / "plain").write_text("x")
    for url, why in (((tmp_path / "plain").as_uri(), "is a file, not a folder"),
                     ("file:///proc/logos-cache", "cannot be")):
        with pytest.raises(vc.CacheError, match=f"cache={url}: {why}"):
            vc.open_cache(url, env=env)
    made = tmp_path / "not" / "yet"
    assert vc.open_cache(made.as_uri(), env=env)[0] is not None and made.is_dir()
    c = vc.VerdictCache(f"memory://slow-{os.getpid()}", "k")
    monkeypatch.setattr(c.fs, "ls", lambda *a, **k: time.sleep(30))
    began = time.monotonic()
    with pytest.raises(vc.CacheError, match="did not answer in 0.5 s"):
        c.reach(0.5)
    assert time.monotonic() - began < 10
    monkeypatch.setattr(vc.VerdictCache, "reach", lambda self, seconds=0: pytest.fail("asked again"))
    monkeypatch.setenv("LOGOS_CACHE_KEY", "k")
    assert vc.store(f"memory://store-{os.getpid()}") is not None


def test_the_key_covers_what_the_verdict_depends_on():
    base = {"dtype": "float32", "steps": 2, "tolerance": {"abs": 1e-4, "rel": 1e-3}, "config": "c",
            "precision": None, "source": "s", "bundle": {"model.py": "m"}, "weights": "w",
            "code": "k", "environment": "e", "threads": 1}
    k = check_key(base)
    assert k == check_key(dict(reversed(list(base.items()))))
    for part, other in [("dtype", "bfloat16"), ("steps", 3), ("tolerance", {"abs": 1e-4, "rel": 1e-2}),
                        ("precision", {"matmul": ["bf16", "fp32"]}), ("weights", {"sha256": "x"}),
                        ("bundle", {"model.py": "n"}), ("environment", "f"), ("threads", 2)]:
        assert check_key({**base, part: other}) != k, part


DERIVED = "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n"


def test_a_signed_verdict_recording_another_key_or_environment_is_a_miss(store):
    """A lookup names the environment its key was made in: an entry whose verdict records another
    (a writer that published what it computed elsewhere), or another key than its own, is a miss
    said once, however it is signed."""
    store.put(KEY, _result(key=KEY, hashes={"environment": "e1"}))
    assert store.get(KEY, "e1")["verdict"] == "pass"
    assert store.get(KEY, "e2") is None and "another key or environment" in store.said[-1]
    store.put("b" * 64, _result(key=KEY, hashes={"environment": "e1"}))
    assert store.get("b" * 64, "e1") is None and len(store.said) == 2
    assert store.has(KEY, "e1") and not store.has(KEY, "e2") and not store.has("b" * 64, "e1")   # as get takes it
    assert len(store.said) == 2


def test_a_derived_programs_entry_of_another_environment_is_a_miss_and_its_weights_are_made(tmp_path):
    """The lookup that decides whether a derived program needs its import takes an entry as the
    lock does: one whose verdict records another environment than its key names is a miss, so the
    weights are made and the check runs here (it erred: no weights), and its entry is replaced."""
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "ci-secret"}
    ci = _zoo(tmp_path, "ci")
    rc, ran, out = doit(ci, f"cache={url}", env=key)
    assert rc == 0, out
    c, keys = vc.VerdictCache(url, "ci-secret"), {}
    for dt in ("float64", "float32"):   # published by a writer that computed them elsewhere
        r = json.loads((ci / f"build/results/d/{dt}.json").read_text())
        keys[dt], env = r["key"], r["hashes"]["environment"]
        r["hashes"]["environment"] = "f" * 64
        assert c.put(r["key"], r)
    dev = _zoo(tmp_path, "dev")
    rc, ran, out = doit(dev, f"cache={url}", env=key)
    assert rc == 0 and "weights:d" in ran and out.count("another key or environment") == 2, out
    got = _results(dev)
    for dt in ("float64", "float32"):
        assert got[("d", dt)]["verdict"] == "pass" and not got[("d", dt)].get("from_cache"), got[("d", dt)]
        assert got[("a", dt)]["from_cache"]
        assert vc.VerdictCache(url, "ci-secret").get(keys[dt], env)["verdict"] == "pass"   # replaced


def test_a_folder_in_an_entrys_place_is_replaced_by_the_entry(store):
    """A folder where an entry goes is no entry (a miss, not listed); publishing replaces it,
    never moves the entry into it."""
    p = store.path(KEY)
    store.fs.makedirs(p, exist_ok=True)
    store.fs.pipe_file(p + "/junk.json", b"junk")
    assert store.get(KEY) is None and store.listed() == {"junk"}
    assert store.put(KEY, _result()) and store.get(KEY)["verdict"] == "pass"
    assert store.listed() == {KEY}


def _zoo(tmp_path, name="zoo"):
    z = make_zoo(tmp_path / name, {"d": (PROG_A, DERIVED), "a": (PROG_A, None), "b": (PROG_B, None)})
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    _weights(z / "ckpt" / "w.bin", 5)
    _weights(str(z / "weights/a/w.f64"), 1)
    return z


def _results(z):
    return {(n, d): json.loads((z / f"build/results/{n}/{d}.json").read_text())
            for n in "dab" for d in ("float64", "float32")}


def test_ci_fills_the_cache_and_a_fresh_clone_takes_its_verdicts(tmp_path):
    first, url = (tmp_path / "first").as_uri(), (tmp_path / "cache").as_uri()
    key = {"LOGOS_CACHE_KEY": "ci-secret"}
    ci = _zoo(tmp_path, "ci")
    rc, ran, out = doit(ci, f"cache={first}", env=key)   # CI locks and publishes as it goes
    assert rc == 0 and {"weights:d", "lock:d", "lock:a", "cache"} <= ran, out
    assert len(list((tmp_path / "first").rglob("*.json"))) == 6
    rc, ran, out = doit(ci, f"cache={url}", env=key)   # a no-op over its build/ fills a new cache
    assert rc == 0 and ran == {"cache"} and "published 6 verdict(s)" in out, out
    rc, ran, out = doit(ci, f"cache={url}", env=key)   # and then knows it is there
    assert rc == 0 and "published" not in out and "nothing moved since the last run" in out, out
    shutil.rmtree(tmp_path / "cache")                  # emptied (a bucket purged): filled again
    rc, ran, out = doit(ci, f"cache={url}", env=key)
    assert rc == 0 and "published 6 verdict(s)" in out, out
    computed = _results(ci)

    dev = _zoo(tmp_path, "dev")                    # a fresh clone with the cache
    rc, ran, out = doit(dev, f"cache={url}", env=key)
    assert rc == 0, out
    assert {"lock:d", "lock:a", "lock:b"} <= ran and not {"weights:d", "wmanifest:d"} & ran, ran
    assert not (dev / "build/weights/d").exists()   # a hit needs no import at all
    for k, r in _results(dev).items():
        assert r["from_cache"] is True and r["cache"]["url"] == url, k
        assert r["cache"]["written_by"]["run"] and r["verdict"] == computed[k]["verdict"]
        assert r["output"] == computed[k]["output"] and r["execution"] == computed[k]["execution"]
    con = sqlite3.connect(dev / "build/results.sqlite")
    rows = [json.loads(x) for (x,) in con.execute("SELECT result FROM runs")]
    assert len(rows) == 6 and all(r["from_cache"] for r in rows)
    report = json.loads((dev / "build/report.json").read_text())
    assert report["counts"] == {"pass": 6, "fail": 0, "error": 0}
    assert all(r.get("from_cache") for r in report["results"])
    assert "(cached)" in (dev / "build/summary.md").read_text()
    import xml.etree.ElementTree as ET
    cases = list(ET.parse(dev / "build/junit.xml").getroot().iter("testcase"))
    assert len(cases) == 6 and all(f"taken from the verdict cache {url}" in (c.findtext("system-out") or "")
                                   for c in cases)
    rc, ran, out = doit(dev, f"cache={url}", env=key)   # nothing to do: no import, no lock handed
    assert rc == 0 and ran <= {"cache"}, ran
    other = tmp_path / "other"   # taken from one cache: never published to another as this run's
    rc, ran, out = doit(dev, f"cache={other.as_uri()}", env=key)
    assert rc == 0 and "published" not in out and not list(other.rglob("*.json")), out
    p = subprocess.run([sys.executable, "-m", "emitter", "results"], cwd=dev, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(dev)})
    assert p.returncode == 0 and "0 not passing, 6 taken from the verdict cache, 0 not current" in p.stdout, \
        p.stdout + p.stderr
    assert sum("pass  (from the cache) " in line for line in p.stdout.splitlines()) == 6, p.stdout
    p = subprocess.run([sys.executable, "-m", "emitter", "results", "--json"], cwd=dev, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(dev)})
    assert all(x["from_cache"] is True and x["current"] for x in json.loads(p.stdout)["runs"]), p.stdout

    # a tampered entry: a miss said once, the check runs here and its entry is replaced
    entries = sorted((tmp_path / "cache").rglob("*.json"))
    assert len(entries) == 6
    for e in entries:
        env = json.loads(e.read_text())
        env["body"] = env["body"].replace('"pass"', '"fail"')
        e.write_text(json.dumps(env))
    shutil.rmtree(dev / "build")
    rc, ran, out = doit(dev, f"cache={url}", env=key)
    assert rc == 0, out
    assert out.count("signature does not match") == 6 and "weights:d" in ran, out
    assert not any(r.get("from_cache") for r in _results(dev).values())
    p = subprocess.run([sys.executable, "-m", "emitter", "results", "--json"], cwd=dev, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(dev)})
    assert not any(x["from_cache"] for x in json.loads(p.stdout)["runs"]), p.stdout   # computed here
    assert all(vc.VerdictCache(url, "ci-secret").verified(e.stem, e.read_bytes()) for e in entries)

    # a run with another key: every entry a miss said once, none overwritten
    shutil.rmtree(dev / "build")
    rc, ran, out = doit(dev, f"cache={url}", env={"LOGOS_CACHE_KEY": "stale"})
    assert rc == 0 and out.count("another LOGOS_CACHE_KEY") == 1, out
    assert not any(r.get("from_cache") for r in _results(dev).values())
    assert all(vc.VerdictCache(url, "ci-secret").verified(e.stem, e.read_bytes()) for e in entries)

    # a reader without the key uses no cache at all
    shutil.rmtree(dev / "build")
    rc, ran, out = doit(dev, f"cache={url}")
    assert rc == 0 and "LOGOS_CACHE_KEY is not set" in out and "cache" not in ran, out
    assert not any("from_cache" in r for r in _results(dev).values())


def test_verdicts_locked_without_a_cache_are_published_later_derived_ones_too(tmp_path):
    """A build/ made with no cache (a plain `doit`, then restored in CI) fills a new cache on the
    first run that holds the key: every verdict, the derived program's included, because its lock
    recorded the key it stands for even with no cache to publish to."""
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "ci-secret"}
    plain = _zoo(tmp_path, "plain")
    rc, ran, out = doit(plain)
    assert rc == 0 and {"weights:d", "lock:d", "lock:a", "lock:b"} <= ran, out
    assert not any("from_cache" in r for r in _results(plain).values())
    plain_key = _results(plain)[("d", "float64")]["cache"]["key"]
    assert len(plain_key) == 64 and _results(plain)[("d", "float64")]["cache"]["url"] is None
    rc, ran, out = doit(plain, f"cache={url}", env=key)
    assert rc == 0 and "published 6 verdict(s)" in out and not {"lock:d", "weights:d"} & ran, out
    entries = {e.stem for e in (tmp_path / "cache").rglob("*.json")}
    assert plain_key in entries and len(entries) == 6

    dev = _zoo(tmp_path, "dev")    # and a fresh clone takes them all, importing nothing
    rc, ran, out = doit(dev, f"cache={url}", env=key)
    assert rc == 0 and not {"weights:d", "wmanifest:d"} & ran, out
    assert all(r["from_cache"] for r in _results(dev).values())
    assert _results(dev)[("d", "float64")]["cache"]["key"] == plain_key


def test_a_hand_edited_key_is_never_published(tmp_path):
    """A result whose recorded key was edited by hand is a moved target: its lock runs again and
    what is published is the verdict under the key it really stands for."""
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "ci-secret"}
    z = _zoo(tmp_path)
    assert doit(z)[0] == 0
    path = z / "build/results/d/float64.json"
    r = json.loads(path.read_text())
    true_key, r["cache"]["key"] = r["cache"]["key"], "0" * 64
    path.write_text(json.dumps(r))
    rc, ran, out = doit(z, f"cache={url}", env=key)
    assert rc == 0 and "lock:d" in ran, out
    entries = {e.stem for e in (tmp_path / "cache").rglob("*.json")}
    assert true_key in entries and "0" * 64 not in entries and len(entries) == 6
    assert json.loads(path.read_text())["cache"]["key"] == true_key


def test_a_run_that_names_its_locks_publishes_what_it_settled(tmp_path):
    """`doit lock:NAME cache=URL` leaves out the `cache` task: the verdicts of the locks it names,
    run or up to date, are published all the same, and no other program's; a later whole run
    publishes the rest and keeps knowing what the named run sent."""
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "ci-secret"}
    z = _zoo(tmp_path)
    assert doit(z)[0] == 0
    keys = {k: r["cache"]["key"] for k, r in _results(z).items() if r.get("cache", {}).get("key")}
    rc, ran, out = doit(z, "lock:a", "lock:d", f"cache={url}", env=key)
    assert rc == 0 and "cache" not in ran and "published 4 verdict(s)" in out, out
    entries = {e.stem for e in (tmp_path / "cache").rglob("*.json")}
    assert len(entries) == 4 and keys[("d", "float64")] in entries, entries
    rc, ran, out = doit(z, "lock:a", f"cache={url}", env=key)
    assert rc == 0 and "published" not in out, out
    rc, ran, out = doit(z, f"cache={url}", env=key)
    assert rc == 0 and "published 2 verdict(s)" in out, out
    assert len({e.stem for e in (tmp_path / "cache").rglob("*.json")}) == 6


def test_an_importer_library_upgrade_re_derives_and_changes_the_key(tmp_path):
    """The import digest holds the versions of the libraries the importers compute with (gguf's
    dequantisation makes the numbers as much as the importer does): a new gguf re-derives the
    weights, even on a plain no-op run, and a derived program's cached verdicts no longer match,
    while the others' still do."""
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "ci-secret"}
    fake = tmp_path / "site"
    (fake / "gguf-99.0.dist-info").mkdir(parents=True)
    upgraded = {"PYTHONPATH": str(fake)}
    z = _zoo(tmp_path)
    assert doit(z, f"cache={url}", env=key)[0] == 0
    derived = z / "build/weights/d/.derived.json"
    before = json.loads(derived.read_text())["key"]
    rc, ran, out = doit(z, env=upgraded)
    assert rc == 0 and "weights:d" in ran and "lock:a" not in ran, out
    assert json.loads(derived.read_text())["key"] != before
    rc, ran, out = doit(z, env=upgraded)
    assert rc == 0 and "weights:d" not in ran, out

    dev = _zoo(tmp_path, "dev")
    rc, ran, out = doit(dev, f"cache={url}", env={**key, **upgraded})
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    cached = {k: r.get("from_cache", False) for k, r in _results(dev).items()}
    assert cached == {(n, d): n != "d" for n in "dab" for d in ("float64", "float32")}, cached


def test_derived_weights_edited_by_hand_are_derived_again_before_any_lock(tmp_path):
    """Derived weights stand, in every key, for "this checkpoint through this importer": once they
    are not what the import made (an edit by hand), the import runs again before the lock, so no
    verdict is ever computed on, recorded for, or taken from the cache for the edited file."""
    url, key = (tmp_path / "cache").as_uri(), {"LOGOS_CACHE_KEY": "ci-secret"}
    z = _zoo(tmp_path)
    assert doit(z, f"cache={url}", env=key)[0] == 0
    made = (z / "build/weights/d/w.f64").read_bytes()
    before = {n: r["key"] for n, r in _results(z).items()}
    _weights(str(z / "build/weights/d/w.f64"), 9)
    assert (z / "build/weights/d/w.f64").read_bytes() != made
    rc, ran, out = doit(z, f"cache={url}", env=key)
    assert rc == 0 and "weights:d" in ran, out
    assert (z / "build/weights/d/w.f64").read_bytes() == made     # what the import makes, again
    after = _results(z)
    assert {n: r["key"] for n, r in after.items()} == before
    assert all(r["verdict"] == "pass" for r in after.values())
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 6


def _ship(site, version, seed):
    """A distribution `ckptpkg` of one checkpoint file, with its RECORD (as pip installs it)."""
    import base64
    import hashlib
    shutil.rmtree(site, ignore_errors=True)
    (site / "ckptpkg").mkdir(parents=True)
    (site / "ckptpkg/__init__.py").write_text("")
    data = np.random.default_rng(seed).standard_normal(16).astype("<f8").tobytes()
    (site / "ckptpkg/w.bin").write_bytes(data)
    info = site / f"ckptpkg-{version}.dist-info"
    info.mkdir()
    (info / "top_level.txt").write_text("ckptpkg\n")
    sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"ckptpkg/__init__.py,,\nckptpkg/w.bin,sha256={sha},{len(data)}\n")
    return data


def test_a_new_release_of_a_package_checkpoint_of_the_same_size_imports_again(tmp_path):
    """A package checkpoint stands for its RECORD's sha256 (what the derived cache key names), not
    its size: a new release with other numbers in a file of the same size is imported again, so
    the old checkpoint's weights are never locked, nor cached, under the new one's key."""
    site = tmp_path / "site"
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: fake\n"
                                                  "  checkpoint: package:ckptpkg/w.bin\n")})
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    env = {"PYTHONPATH": str(site)}
    _ship(site, "1.0", 1)
    assert doit(z, env=env)[0] == 0
    new = _ship(site, "1.1", 2)
    rc, ran, out = doit(z, env=env)
    assert rc == 0 and {"weights:d", "lock:d"} <= ran, out
    assert (z / "build/weights/d/w.f64").read_bytes() == new


def test_a_verdict_the_cache_task_cannot_publish_is_a_warning(tmp_path, monkeypatch, capsys):
    """A put that fails (a full disk, a refusal) leaves the verdicts standing: the cache task
    says which were not published and succeeds (it raised an UnboundLocalError of its own)."""
    from emitter.pipeline import log
    from test_pipeline import _entries
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z)[0] == 0
    monkeypatch.chdir(z)
    monkeypatch.setenv("LOGOS_CACHE_KEY", "k")
    url = (tmp_path / "cache").as_uri()

    def refused(self, key, result):
        raise PermissionError("refused")
    monkeypatch.setattr(vc.VerdictCache, "put", refused)
    said = []
    monkeypatch.setattr(log.LOG, "warning", said.append)
    assert publish_all(list(_entries(z).values()), 1, url) is True
    assert len(said) == 2 and all("cache: not published: build/results/b/" in s and
                                  "PermissionError: refused" in s for s in said), said


def test_a_result_edited_since_its_lock_wrote_it_is_never_published(tmp_path, monkeypatch):
    """The `cache` task publishes a result only where its bytes are those the lock wrote (the
    sha256 its lock status records): one edited by hand, its key left as it was (a fail made a
    pass, a figure made better), is nobody's verdict, and a fresh clone would take it as current."""
    from test_pipeline import _entries
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z)[0] == 0
    monkeypatch.chdir(z)
    monkeypatch.setenv("LOGOS_CACHE_KEY", "k")
    url = (tmp_path / "cache").as_uri()
    path = z / "build/results/b/float64.json"
    r = json.loads(path.read_text())
    r["output"]["max_abs"], r["worst"] = 0.0, None   # the key, the verdict and the size kept or not
    path.write_text(json.dumps(r, indent=1))
    assert publish_all(list(_entries(z).values()), 1, url) is True
    kept = json.loads((z / "build/results/b/float32.json").read_text())["key"]
    assert {p.stem for p in (tmp_path / "cache").rglob("*.json")} == {kept} != {r["key"]}


def test_a_store_that_does_not_answer_is_asked_once_a_run(monkeypatch):
    """A store whose reads stall (s3fs retried each GET for minutes, check by check) or fail is
    given REACH_S seconds once: then the cache is not asked again this run, said once, and every
    check left is run here."""
    import threading
    import time
    said = []
    c = vc.VerdictCache("memory://stalled-cache", "sekrit", said.append)
    monkeypatch.setattr(vc, "REACH_S", 0.3)
    release, calls = threading.Event(), []

    def stalled(*a, **k):
        calls.append(a)
        release.wait(60)
        raise OSError("stalled")
    monkeypatch.setattr(c.fs, "open", stalled)
    try:
        t = time.monotonic()
        assert c.get("a" * 64) is None and c.get("b" * 64) is None and not c.has("c" * 64)
        assert c.put("d" * 64, _result()) is False and c.listed() is None
        assert time.monotonic() - t < 30   # (not a timing: a stall of 60 s each would be minutes)
    finally:
        release.set()
    assert len(calls) == 1, calls
    assert len(said) == 1 and "did not answer in 0.3 s: not used for the rest of this run" in said[0], said


def test_an_entry_of_many_small_containers_costs_about_its_size(tmp_path):
    """An unsigned entry up to MAX_ENTRY of 40M empty objects grew 25 times in json.loads (3.4 GB
    for 128 MiB) before its schema was read: what is not a string in it is read first, and a few
    keys are all an envelope holds."""
    code = ("import resource, sys\nsys.path.insert(0, sys.argv[1])\n"
            "from emitter.pipeline.cache import VerdictCache\n"
            "data = b'[' + b'{},' * ((32 << 20) // 3) + b'{}]'\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "why = VerdictCache('file://' + sys.argv[2], 'k').verified('ab' * 32, data)\n"
            "print(why, '|', (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code, root, str(tmp_path)], capture_output=True, text=True)
    why, grown = p.stdout.rsplit("|", 1)
    assert p.returncode == 0 and why.strip() == "not a verdict-cache entry", p.stderr
    assert int(grown) < 8 * (32 << 20), grown   # (json.loads took about 25 times)
