"""Task names are unique by construction: a program file name that is not a plain name gets a slug
no plain name can be, so no two programs of a zoo ever share `emit:NAME`, `lock:NAME` or
build/.../NAME, whatever their files are called."""

import hashlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from hypothesis import given, settings
from hypothesis import strategies as st

from emitter.pipeline.config import NAME_RE, slug
from test_pipeline import PROG_B, make_zoo


def _run(cwd, *args):
    e = {**os.environ, "LOGOS_PROGRESS": "names"}
    p = subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, capture_output=True,
                       text=True, errors="replace", env=e, timeout=600)
    ran = {line[3:].strip() for line in p.stdout.splitlines() if line.startswith(".  ")}
    return p.returncode, ran, p.stdout + p.stderr


def test_a_plain_name_that_looks_like_a_slug_keeps_its_own_tasks(tmp_path):
    """`a b.logos` beside a program named what `a b` slugged to before (`invalid-` and 12 hex,
    itself a plain name): both get their tasks, rows and JUnit cases; no duplicated definition."""
    bad = slug("a b")
    old = "invalid-" + hashlib.sha256(b"a b").hexdigest()[:12]    # what `a b` slugged to before
    assert NAME_RE.fullmatch(old) and slug(old) == old and bad != old
    z = make_zoo(tmp_path / "zoo", {"a b": (PROG_B, None), old: (PROG_B, None)})
    rc, ran, out = _run(z)
    assert "duplicated definition" not in out and "Traceback" not in out, out[-3000:]
    assert rc not in (0, 3), out[-3000:]                      # the bad program's tasks fail
    for name in (bad, old):
        assert {f"emit:{name}", f"lock:{name}"} <= ran, (name, ran, out[-3000:])
    assert "report" in ran
    rows = json.loads((z / "build/report.json").read_text())["results"]
    by_name = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)
    assert set(by_name) == {bad, old}, by_name.keys()
    assert [r["verdict"] for r in by_name[old]] == ["pass", "pass"], by_name[old]
    assert by_name[bad] and all(r["verdict"] == "error" for r in by_name[bad]), by_name[bad]
    assert all("`a b` is not a plain program name" in r["reason"] for r in by_name[bad])
    assert (z / "build/results" / old / "float64.json").is_file()
    assert (z / "build/status" / f"{bad}.emit.json").is_file()
    cases = ET.parse(z / "build/junit.xml").getroot().iter("testcase")
    assert {c.get("classname") for c in cases} == {bad, old}
    # each is a task name doit takes on its own command line, with no shell quoting needed
    listed = _run(z, "list", "--all", "--quiet")[2].split()
    assert {f"emit:{bad}", f"lock:{bad}", f"emit:{old}", f"lock:{old}"} <= set(listed), listed
    (z / "build/status" / f"{bad}.lock.json").unlink()     # what its lock recorded, gone
    rc, ran, out = _run(z, f"lock:{bad}")
    assert f"lock:{bad}" in ran and "duplicated definition" not in out, out[-3000:]


def test_the_slug_of_a_name_that_is_not_plain():
    s = slug("a b")
    assert s == slug("a b")                                       # stable: a hash of the bytes
    assert s.startswith("invalid-") and not NAME_RE.fullmatch(s)  # no plain name is one
    assert hashlib.sha256(b"a b").hexdigest() in s                # the whole digest
    for name in ("ok", "A-1_b", "n" * 128, "invalid-0123456789ab"):
        assert slug(name) == name                                 # a plain name is itself
    # not UTF-8 (as os.listdir gives it), control characters, too long, a dot, a leading `-`
    odd = ["caf\udce9", "caf\udce8", "a\x01b", "n" * 129, "a.b", "-x", "", "a b", "a  b", "/", ".."]
    slugs = [slug(n) for n in odd]
    assert len(set(slugs)) == len(odd)
    for s in slugs:
        assert not NAME_RE.fullmatch(s) and s.isascii() and s.isprintable()
        assert "/" not in s and "\\" not in s and "=" not in s and ":" not in s and "." not in s
        assert len(s) < 128 and s not in (".", "..")


# any text, surrogates too: a byte os.listdir could not decode (U+DC80..U+DCFF), or a lone one
NAMES = st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr),
                          st.sampled_from("ab-_~ .")), max_size=40)


def test_undecodable_names_are_told_apart():
    """A byte os.listdir could not decode comes back as a surrogate: each such name has its own
    slug, also beside the lone surrogates whose UTF-8 those bytes would be."""
    names = ["\udced\udca0\udc80", "\ud800", "caf\udce9", "caf\u00e9", "caf\udcc3\udca9"]
    assert len({slug(n) for n in names}) == len(names)


@settings(max_examples=300, deadline=None)
@given(NAMES, NAMES)
def test_two_names_never_share_a_slug(a, b):
    if a != b:
        assert slug(a) != slug(b)
    assert bool(NAME_RE.fullmatch(slug(a))) == bool(NAME_RE.fullmatch(a))
