"""The verdict cache on a real S3 API: moto's S3 server on 127.0.0.1, reached through s3fs with
nothing of our own: the endpoint is fsspec's environment configuration (FSSPEC_S3_ENDPOINT_URL)
and the credentials the usual AWS_* variables. CI's run publishes signed entries to
s3://BUCKET/PREFIX, and a fresh clone (an empty build/) takes every verdict from there."""

import json
import os

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

import fsspec.config  # noqa: E402

from emitter.pipeline import cache as vc  # noqa: E402
from test_cache import _results, _zoo  # noqa: E402
from test_pipeline import doit  # noqa: E402

BUCKET, SECRET = "logos-verdicts", "ci-secret"
URL = f"s3://{BUCKET}/zoo"


@pytest.fixture(scope="module")
def s3():
    """(the environment a doit run is given, an s3fs filesystem on the same server)."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"FSSPEC_S3_ENDPOINT_URL": f"http://{host}:{port}",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true",   # never ask an instance-metadata address
           "LOGOS_CACHE_KEY": SECRET}
    # what a doit process makes of that environment, read by fsspec's own parser
    conf = {}
    fsspec.config.set_conf_env(conf, envdict=env)
    assert conf == {"s3": {"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]}}
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], key="testing",
                           secret="testing", skip_instance_cache=True)
    fs.mkdir(BUCKET)
    yield env, fs, conf
    server.stop()


def _entries(fs):
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[1].removesuffix(".json"): p for p in fs.find(f"{BUCKET}/zoo")}


def test_ci_publishes_to_s3_and_a_fresh_clone_takes_every_verdict(s3, tmp_path, monkeypatch):
    env, fs, conf = s3
    ci = _zoo(tmp_path, "ci")
    rc, ran, out = doit(ci, f"cache={URL}", env=env)
    assert rc == 0 and {"weights:d", "lock:d", "lock:a", "lock:b"} <= ran, out
    entries = _entries(fs)
    computed = _results(ci)
    assert set(entries) == {r["cache"]["key"] for r in computed.values()}, (entries, out)
    # each object is the signed envelope for its key, read back from S3 through this process's
    # fsspec configured as the doit run's was (by the same environment)
    monkeypatch.setattr(fsspec.config, "conf", conf)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_EC2_METADATA_DISABLED"):
        monkeypatch.setenv(k, env[k])
    reader = vc.VerdictCache(URL, SECRET)
    for key, path in entries.items():
        assert reader.verified(key, fs.cat_file(path)), key
        got = reader.get(key)
        assert got["from_cache"] is True and got["verdict"] == "pass"
    assert not vc.VerdictCache(URL, "another key", lambda s: None).get(next(iter(entries)))

    dev = _zoo(tmp_path, "dev")               # a fresh clone: no build/ at all
    assert not (dev / "build").exists()
    rc, ran, out = doit(dev, f"cache={URL}", env=env)
    assert rc == 0, out
    assert {"lock:d", "lock:a", "lock:b"} <= ran and not {"weights:d", "wmanifest:d"} & ran, ran
    assert not (dev / "build/weights/d").exists()     # a hit needs no import
    for k, r in _results(dev).items():
        assert r["from_cache"] is True and r["cache"]["url"] == URL, k
        assert r["verdict"] == computed[k]["verdict"] and r["output"] == computed[k]["output"], k
    report = json.loads((dev / "build/report.json").read_text())
    assert report["counts"] == {"pass": 6, "fail": 0, "error": 0}
    assert all(r.get("from_cache") for r in report["results"])
    assert set(_entries(fs)) == set(entries)        # taking verdicts publishes nothing new

    # an entry tampered with on S3 is a miss, said once; that check runs here and is replaced
    victim = computed[("a", "float32")]["cache"]["key"]
    envelope = json.loads(fs.cat_file(entries[victim]))
    envelope["body"] = envelope["body"].replace('"pass"', '"fail"')
    fs.pipe_file(entries[victim], json.dumps(envelope).encode())
    fresh = _zoo(tmp_path, "fresh")
    rc, ran, out = doit(fresh, f"cache={URL}", env=env)
    assert rc == 0 and out.count("signature does not match") == 1, out
    cached = {k: r["from_cache"] for k, r in _results(fresh).items()}
    assert cached == {k: k != ("a", "float32") for k in computed}, cached
    assert reader.verified(victim, fs.cat_file(entries[victim]))


def test_without_the_key_nothing_is_read_or_written(s3, tmp_path):
    env, fs, _ = s3
    before = set(_entries(fs))
    z = _zoo(tmp_path, "nokey")
    rc, ran, out = doit(z, f"cache={URL}", env={k: v for k, v in env.items() if k != "LOGOS_CACHE_KEY"})
    assert rc == 0 and "LOGOS_CACHE_KEY is not set" in out and "cache" not in ran, out
    assert not any("from_cache" in r for r in _results(z).values())
    assert set(_entries(fs)) == before


def test_a_cache_that_cannot_be_used_refuses_the_run_before_any_task(s3, tmp_path):
    """No credentials, or a bucket that does not exist: one line naming the URL and why, exit 3,
    nothing run (not a run whose every lock fails on the store)."""
    env, fs, _ = s3
    z = _zoo(tmp_path, "refused")
    bare = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    bare.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"))
    for e, url, why in ((bare, URL, "cannot be reached (NoCredentialsError"),
                        (env, "s3://no-such-bucket/zoo", "its bucket `no-such-bucket` does not exist")):
        rc, ran, out = doit(z, f"cache={url}", env=e)
        assert rc == 3 and ran == set() and f"doit: refused: cache={url}: {why}" in out, out
        assert "Traceback" not in out and not (z / "build/results").exists(), out
    rc, ran, out = doit(z, f"cache={URL}/not-made-yet", env=env)   # an empty prefix: the first entry makes it
    assert rc == 0 and "lock:a" in ran, out
