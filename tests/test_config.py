"""Config discovery and validation: every refusal names the file, line and key, and only that
program carries the error."""

import json
import os
import subprocess
import sys

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from emitter.importers import resolve_package_file
from emitter.pipeline.config import ConfigError, discover, load_defaults
from emitter.pipeline.paths import Tree, inside


def zoo(tmp_path, files):
    (tmp_path / "programs").mkdir(exist_ok=True)
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return {pc.name: pc for pc in discover(str(tmp_path))}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = "Let x be a 1 by 2 tensor of Real.\nLet y be sigmoid of x.\n"


@pytest.mark.parametrize("yaml_text, where, words", [
    ("colour: red\n", "programs/p.yaml:1", "`colour`: unknown key"),
    ('"a\\x1b[2J\\x01": 1\n', "programs/p.yaml:1", "`a\\x1b[2J\\x01`: unknown key"),   # (a terminal escape: shown)
    ("steps: 2\nsteps_: 1\n", "programs/p.yaml:2", "`steps_`"),
    ("steps: '2'\n", "programs/p.yaml:1", "`steps`: must be a positive integer"),
    ("steps: true\n", "programs/p.yaml:1", "`steps`: must be a positive integer"),
    ("lock: yes please\n", "programs/p.yaml:1", "`lock`: must be true or false"),
    ("dtypes: [float16]\n", "programs/p.yaml:1", "`float16` is not a dtype; did you mean `bfloat16`?"),
    ("dtypes: [float6]\n", "programs/p.yaml:1", "`float6` is not a dtype; did you mean `float64`?"),
    ("stpes: 2\n", "programs/p.yaml:1", "`stpes`: unknown key; did you mean `steps`?"),
    ("roots: [/mnt]\n", "programs/p.yaml:1", "`roots` is zoo-wide: it goes in programs/defaults.yaml"),
    ("limits: {secnds: 5}\n", "programs/p.yaml:1", "`limits.secnds`: `secnds` is not a limit; did you mean `seconds`?"),
    ("weights: weights/nothere\n", "programs/p.yaml:1", "`weights`: `weights/nothere` is not a directory"),
    ("tolerances:\n  float32: {abs: -1}\n", "programs/p.yaml:2", "`tolerances.float32`"),
    ("weights: ../outside\n", "programs/p.yaml:1", "`weights`: `../outside` leaves the repository"),
    ("weights: /etc\n", "programs/p.yaml:1", "leaves the repository"),
    ('weights: "weights/a\\0x"\n', "programs/p.yaml:1", "is no path: it holds a NUL character"),
    ("derive: {importer: gguf, checkpoint: ../../x.gguf}\n", "programs/p.yaml:1",
     "`derive.checkpoint`: `../../x.gguf` leaves the repository"),
    ("derive: {importer: 'bad name', checkpoint: x}\n", "programs/p.yaml:1", "`derive.importer`"),
    ("derive:\n  importer: ggfu\n  checkpoint: x\n", "programs/p.yaml:2",
     "`derive.importer`: `ggfu` is not an importer (known: gemma3, gguf, qwen35, qwen3next, safetensors); did "
     "you mean `gguf`?"),
    ("derive:\n  importer: gemma3\n  checkpoint: [package:yaml/__init__.py]\n", "programs/p.yaml:3",
     "a checkpoint in chunks is a list of `package:MODULE/path` parts, in order, with `sha256:`"),
    ("derive:\n  importer: gemma3\n  checkpoint: [package:yaml/__init__.py, x.bin]\n  sha256: "
     + "a" * 64 + "\n", "programs/p.yaml:3", "each part of a chunked checkpoint must be a `package:"),
    ("derive:\n  importer: gemma3\n  checkpoint: [package:yaml/__init__.py]\n  sha256: abc\n",
     "programs/p.yaml:3", "the joined file's sha256 as 64 lowercase hex digits"),
    ("derive:\n  importer: gemma3\n  checkpoint: [package:nosuchpkg/a.part0]\n  sha256: "
     + "a" * 64 + "\n", "programs/p.yaml:3", "no installed distribution ships a package `nosuchpkg`"),
    ("derive: {importer: gguf, checkpoint: 'package:yaml/../../x'}\n", "programs/p.yaml:1",
     "a path inside it"),
    ("!!python/object/apply:os.system ['true']\n", "programs/p.yaml", "not valid YAML"),
    ("steps: 2\nwhen: !!timestamp 2001-13-01\n", "programs/p.yaml", "not valid YAML: month must be in 1..12"),
    # YAML 1.2's core schema: what YAML 1.1 made a number or a boolean is text
    ("steps: 1:30\n", "programs/p.yaml:1", "`steps`: must be a positive integer"),
    ("steps: 1_0\n", "programs/p.yaml:1", "`steps`: must be a positive integer"),
    ("lock: no\n", "programs/p.yaml:1", "`lock`: must be true or false"),
    ("lock: off\n", "programs/p.yaml:1", "`lock`: must be true or false"),
    ("steps: !!int abc\n", "programs/p.yaml", "not valid YAML: invalid literal for int()"),
    ("- a\n- b\n", "programs/p.yaml:1", "a mapping of keys"),
    ("steps: 1\ndtypes: [float32]\nsteps: 3\n", "programs/p.yaml:3",
     "the key `steps` is given twice"),
    ("tolerances:\n  float32: {abs: 1}\n  float32: {rel: 1}\n", "programs/p.yaml:3",
     "the key `float32` is given twice"),
    # the bf16 gate's bounds: a NaN never compares, an infinity excuses all, a cosine over 1 never passes
    ("dtypes: [bfloat16]\nbf16: {deviation: .nan}\n", "programs/p.yaml:2",
     "`bf16.deviation`: must be a finite number > 0, got nan"),
    ("bf16: {z: -3}\n", "programs/p.yaml:1", "`bf16.z`: must be a finite number > 0, got -3"),
    ("allow_nonfinite: [X, '../../x', __class__]\n", "programs/p.yaml:1",
     "`allow_nonfinite`: must be a list of leaf names whose files may hold NaN or Inf, got '../../x' among them"),
    ("allow_nonfinite: X\n", "programs/p.yaml:1", "must be a list of leaf names whose files may hold NaN or Inf, got 'X'"),
    ("bf16: {cosine: 2}\n", "programs/p.yaml:1", "`bf16.cosine`: must be a finite number > 0 and <= 1, got 2"),
    ("bf16: {margin_noise: .inf}\n", "programs/p.yaml:1", "`bf16.margin_noise`: must be a finite number >= 0"),
    ("bf16: {cosine: '0.9'}\n", "programs/p.yaml:1", "`bf16.cosine`: must be a finite number"),
    ("bf16:\n  excess: {matmul: -1}\n", "programs/p.yaml:2", "`bf16.excess.matmul`: must be a finite number > 0"),
    ("bf16:\n  excess: {matmull: 4}\n", "programs/p.yaml:2", "`matmull` is not an op; did you mean `matmul`?"),
    ("bf16:\n  excess: 4\n", "programs/p.yaml:2", "`bf16.excess`: must map op names to numbers"),
    ("bf16: {deviatoin: 0.3}\n", "programs/p.yaml:1", "`bf16.deviatoin`: unknown bound"),
    # a key that YAML reads as no text (it crashed every program's run)
    ("steps: 1\n1: 2\n", "programs/p.yaml:2", "`1`: a key is a name, got int (quote it to mean the text)"),
    ("true: 1\n", "programs/p.yaml:1", "`true`: a key is a name, got bool"),
    ("null: 1\n", "programs/p.yaml:1", "`null`: a key is a name, got null"),
    ("limits:\n  1.5: 2\n", "programs/p.yaml:2", "`1.5`: a key is a name, got float"),
    ("? [a, b]\n: 1\n", "programs/p.yaml:1", "a key is a name, got a list or mapping"),
    ("'1': 2\n", "programs/p.yaml:1", "`1`: unknown key"),
    # a deadline past what the OS's timers hold: every lock erred with an OverflowError
    ("limits: {seconds: 1000000000000}\n", "programs/p.yaml:1",
     "`limits.seconds`: must be a whole number from 1 to 31622400, got 1000000000000"),
    ("limits: {steps: 0}\n", "programs/p.yaml:1", "`limits.steps`: must be a whole number from 1 to"),
    # a path longer than any file's (resolving 500 000 `a/` parts took a minute, every run)
    ("weights: " + "a/" * 500_000 + "\n", "programs/p.yaml:1",
     "a/a…` is a path of 1000000 bytes, over the 4096 a file's path can have"),
    ("derive: {importer: gguf, checkpoint: " + "b/" * 300_000 + "x.gguf}\n", "programs/p.yaml:1",
     "`derive.checkpoint`: `b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/b/"
     "b/b/b/b/b/b/b/b/b/b/b/b/b…` is a path of 600006 bytes, over the 4096"),
    ("steps: 2\n\nlock: tr\x07ue\n", "programs/p.yaml:3: not valid YAML: the character U+0007 (", ""),
    ("steps: 2\n\ufffe: 1\n", "programs/p.yaml:2: not valid YAML: the character U+FFFE (", ""),
    ("steps: 2\r\rlock: \x00\r", "programs/p.yaml:3: not valid YAML: the character U+0000 (", ""),
    ("\ufeffsteps: 2\r\nlock: \x1b\r\n", "programs/p.yaml:2: not valid YAML: the character U+001B (", ""),
])
def test_bad_config_names_file_line_and_key(tmp_path, yaml_text, where, words):
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml": yaml_text,
                         "programs/q.logos": SRC})
    assert got["p"].error.startswith(where), got["p"].error
    assert words in got["p"].error
    assert got["q"].error is None                       # the neighbour is unaffected


def test_symlink_out_of_repo_is_refused(tmp_path):
    os.symlink("/tmp", tmp_path / "escape")
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml": "weights: escape/w\n"})
    assert "leaves the repository" in got["p"].error


def test_a_file_the_importer_reads_beside_the_checkpoint_is_held_as_the_checkpoint_is(tmp_path):
    """An HF importer reads the config.json beside its checkpoint: one linked out of the
    repository, or to a device (/dev/zero: an endless read), is refused by name, as a linked
    checkpoint is, and only that program carries the error; the fingerprint never reads a device."""
    from emitter import fingerprint
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"x")
    files = {"programs/p.logos": SRC, "programs/ok.logos": SRC,
             "programs/p.yaml": "derive: {importer: qwen35, checkpoint: ck/model.safetensors}\n"}
    (tmp_path / "ck" / "config.json").write_text("{}")
    assert zoo(tmp_path, files)["p"].error is None
    for target, said in ((str(tmp_path.parent), "leaves the repository"), ("/dev/zero", "leaves the repository")):
        os.unlink(tmp_path / "ck" / "config.json")
        os.symlink(target, tmp_path / "ck" / "config.json")
        got = zoo(tmp_path, files)
        assert said in got["p"].error and "ck/config.json" in got["p"].error, got["p"].error
        assert "the importer reads it beside the checkpoint" in got["p"].error
        assert got["ok"].error is None
    os.unlink(tmp_path / "ck" / "config.json")
    os.mkfifo(tmp_path / "ck" / "config.json")          # inside, but no file
    got = zoo(tmp_path, files)
    assert "`ck/config.json`, which the importer reads, is not a file" in got["p"].error, got["p"].error
    assert fingerprint.sha256_or_none(str(tmp_path / "ck" / "config.json")) is None   # never opened
    assert fingerprint.sha256_or_none("/dev/zero") is None
    # the checkpoint a link to another folder's: the config.json read is the one beside its target
    os.unlink(tmp_path / "ck" / "config.json")
    (tmp_path / "ck" / "config.json").write_text("{}")
    (tmp_path / "real").mkdir()
    os.replace(tmp_path / "ck" / "model.safetensors", tmp_path / "real" / "model.safetensors")
    os.symlink("../real/model.safetensors", tmp_path / "ck" / "model.safetensors")
    os.symlink(str(tmp_path.parent), tmp_path / "real" / "config.json")
    got = zoo(tmp_path, files)
    assert "`real/config.json` leaves the repository" in got["p"].error, got["p"].error


def test_names_and_orphans(tmp_path):
    zoo(tmp_path, {"programs/has space.logos": SRC, "programs/ok.logos": SRC, "programs/-rf.logos": SRC,
                   "programs/lonely.yaml": "steps: 1\n"})
    warnings = []
    got = {pc.name: pc for pc in discover(str(tmp_path), warnings=warnings)}
    bad = sorted((pc for name, pc in got.items() if name.startswith("invalid-")), key=lambda pc: pc.source)
    assert [pc.source for pc in bad] == ["programs/-rf.logos", "programs/has space.logos"]
    # what a plain name is, said so that the name refused breaks it (`-rf` holds only those characters)
    assert bad[0].error.startswith("programs/-rf.logos: `-rf` is not a plain program name (a letter or digit, "
                                   "then letters, digits, _ and -, at most 128 in all)"), bad[0].error
    assert "`has space` is not a plain program name" in bad[1].error
    assert "lonely" not in got                     # a stray config is a warning, not a program
    assert warnings == ["programs/lonely.yaml: a config with no program beside it "
                        "(no programs/lonely.logos): ignored"]
    assert got["ok"].error is None


def test_defaults_and_overrides(tmp_path):
    os.makedirs(tmp_path / "weights" / "p")
    os.makedirs(tmp_path / "data" / "q")
    got = zoo(tmp_path, {"programs/defaults.yaml": "steps: 3\ntolerances: {float32: {abs: 0.5}}\n",
                         "programs/p.logos": SRC, "programs/q.logos": SRC,
                         "programs/q.yaml": "dtypes: float32\nsteps: 1\nweights: data/q\n"})
    p, q = got["p"], got["q"]
    assert (p.steps, p.dtypes, p.weights) == (3, ["float64", "float32"], "weights/p")
    assert p.tolerance("float32") == (0.5, 1e-3)
    assert (q.steps, q.dtypes, q.weights) == (1, ["float32"], "data/q")
    d = load_defaults(str(tmp_path))
    assert d["lock"] is True


def test_a_program_named_defaults_is_refused_and_the_others_keep_the_zoo_defaults(tmp_path):
    """programs/defaults.yaml is the zoo's config: a program `defaults` would read it as its own
    (and its own keys would change every program's): refused by name, the others untouched."""
    got = zoo(tmp_path, {"programs/defaults.yaml": "steps: 3\n", "programs/defaults.logos": SRC,
                         "programs/p.logos": SRC})
    assert "a program cannot be named `defaults`" in got["defaults"].error
    assert got["p"].error is None and got["p"].steps == 3


def test_bad_defaults_fail_every_program(tmp_path):
    got = zoo(tmp_path, {"programs/defaults.yaml": "weights: x\n", "programs/p.logos": SRC})
    assert got["p"].error.startswith("programs/defaults.yaml:1: `weights`: unknown key")


def test_a_package_folder_that_links_out_names_no_file_of_a_package(tmp_path, monkeypatch):
    """A folder on sys.path (a zoo's own root, where `python -m doit` runs) holding a link named as
    a package, and a dist-info whose RECORD lists a file through it: no `package:` reaches past
    the folder it lies in (here /etc/passwd)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not a checkpoint\n")
    base = tmp_path / "zoo"
    (base / "evil-1.0.dist-info").mkdir(parents=True)
    os.symlink(outside, base / "evil")
    (base / "evil-1.0.dist-info/RECORD").write_text("evil/secret,,\n")
    (base / "evil-1.0.dist-info/top_level.txt").write_text("evil\n")
    monkeypatch.syspath_prepend(str(base))
    with pytest.raises(ValueError, match="is listed by evil-1.0.dist-info but is not a file inside the package"):
        resolve_package_file("evil/secret")


def test_package_checkpoint_resolves_inside_the_package(tmp_path):
    path = resolve_package_file("yaml/__init__.py")
    assert os.path.isfile(path) and path.endswith(os.path.join("yaml", "__init__.py"))
    with pytest.raises(ValueError, match="no installed distribution ships a package `no_such_module_xyz`"):
        resolve_package_file("no_such_module_xyz/a.bin")
    with pytest.raises(ValueError, match="no installed distribution ships a package `os`"):
        resolve_package_file("os/__init__.py")      # the standard library ships no checkpoint
    got = zoo(tmp_path, {"programs/p.logos": SRC,
                         "programs/p.yaml": "derive:\n  importer: gguf\n"
                                            "  checkpoint: package:yaml/__init__.py\n"})
    assert got["p"].error is None
    assert got["p"].derive.checkpoint_path == path and got["p"].weights == "build/weights/p"


def test_config_error_is_a_program_error():
    assert issubclass(ConfigError, ValueError)


def test_undecodable_config_fails_only_its_program(tmp_path):
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs" / "b.yaml").write_bytes(b"steps: 2 # caf\xe9\n")
    got = zoo(tmp_path, {"programs/a.logos": SRC, "programs/b.logos": SRC})
    assert got["a"].error is None
    assert got["b"].error == "programs/b.yaml:1: not UTF-8 text: byte 0xe9 at offset 14"


def test_linked_default_weights_and_program_are_refused(tmp_path):
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    (outside / "w").mkdir(parents=True)
    (outside / "secret.logos").write_text("secret-line\n")
    (tmp_path / "weights").mkdir()
    os.symlink(outside / "w", tmp_path / "weights" / "a")
    (tmp_path / "programs").mkdir()
    os.symlink(outside / "secret.logos", tmp_path / "programs" / "leak.logos")
    got = zoo(tmp_path, {"programs/a.logos": SRC})
    assert "`weights/a` leaves the repository" in got["a"].error
    assert "`programs/leak.logos` leaves the repository" in got["leak"].error
    assert "secret-line" not in got["leak"].error


@pytest.fixture(scope="module")
def linked_tree(tmp_path_factory):
    """A repository with links inside it, out of it and up from it, and a folder beside it."""
    base = tmp_path_factory.mktemp("tree")
    root, out = base / "repo", base / "out"
    (root / "a" / "d").mkdir(parents=True)
    (root / "a" / "f").write_text("")
    out.mkdir()
    os.symlink("a", root / "b")
    os.symlink(str(out), root / "away")
    os.symlink("..", root / "a" / "up")
    os.symlink("../..", root / "a" / "d" / "upup")
    return str(root)


def _inside_by_realpath(root, rel):
    """Every component resolved by the OS: what `inside`'s cached walk must agree with."""
    if not rel or os.path.isabs(rel) or "\0" in rel:
        return None
    root_real = os.path.realpath(root)
    full = os.path.realpath(os.path.join(root_real, rel))
    if full != root_real and not full.startswith(root_real + os.sep):
        return None
    return os.path.relpath(full, root_real)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "d", "f", "away", "up", "upup", "..", ".", "", "new"]),
                min_size=1, max_size=5))
def test_inside_agrees_with_resolving_every_component(linked_tree, parts):
    rel = "/".join(parts)
    tree = Tree(linked_tree)
    for _ in range(2):   # a warm cache gives the same answer as a cold one
        assert inside(linked_tree, rel, tree) == _inside_by_realpath(linked_tree, rel), rel


def test_parse_cache_gives_what_parsing_gives_and_sees_every_edit(tmp_path):
    cache = str(tmp_path / "build" / "cache.json")
    (tmp_path / "build").mkdir()
    files = {"programs/a.logos": SRC, "programs/a.yaml": "steps: 2\ndtypes: [float32]\n",
             "programs/b.logos": SRC, "programs/b.yaml": "when: !!timestamp 2026-01-01\n",
             "programs/defaults.yaml": "steps: 3\n"}
    zoo(tmp_path, files)
    cold = discover(str(tmp_path), cache_file=cache)
    kept = json.loads(open(cache).read())["entries"]
    assert sorted(kept) == ["programs/a.yaml", "programs/defaults.yaml"]   # a date is not JSON
    assert kept["programs/a.yaml"][1] == {"steps": 2, "dtypes": ["float32"]}
    warm = discover(str(tmp_path), cache_file=cache)
    assert warm == cold == discover(str(tmp_path))
    assert warm[0].steps == 2 and warm[0].dtypes == ["float32"]
    assert "`when`: unknown key" in warm[1].error and "programs/b.yaml:1" in warm[1].error
    # an edit of the same size, at once (the same mtime tick, maybe), is a new parse
    (tmp_path / "programs/a.yaml").write_text("steps: 5\ndtypes: [float64]\n")
    after = {pc.name: pc for pc in discover(str(tmp_path), cache_file=cache)}
    assert after["a"].steps == 5 and after["a"].dtypes == ["float64"]
    # a key error read from the cache still points at its line
    (tmp_path / "programs/a.yaml").write_text("steps: 5\ncolour: red\n")
    discover(str(tmp_path), cache_file=cache)
    again = {pc.name: pc for pc in discover(str(tmp_path), cache_file=cache)}
    assert "programs/a.yaml:2: `colour`: unknown key" in again["a"].error
    kept = json.loads(open(cache).read())["entries"]
    assert kept["programs/a.yaml"][1] == {"steps": 5, "colour": "red"}
    # the first bad key in the file is the one named, warm as cold (the cache keeps key order)
    (tmp_path / "programs/a.yaml").write_text("zeta: 1\nalpha: 2\n")
    cold = {pc.name: pc for pc in discover(str(tmp_path), cache_file=cache)}["a"].error
    warm = {pc.name: pc for pc in discover(str(tmp_path), cache_file=cache)}["a"].error
    assert cold == warm and "programs/a.yaml:1: `zeta`: unknown key" in warm


def test_parse_cache_that_cannot_be_written_or_read_costs_only_a_parse(tmp_path):
    zoo(tmp_path, {"programs/a.logos": SRC, "programs/a.yaml": "steps: 2\n"})
    (tmp_path / "build" / "cache.json").mkdir(parents=True)   # in the way: not a file
    for _ in range(2):
        assert discover(str(tmp_path), cache_file=str(tmp_path / "build/cache.json"))[0].steps == 2
    for text in ("not json", '{"version": 3, "entries": {"programs/a.yaml": [1, 2, 3]}}',
                 '{"version": 3, "entries": {"programs/a.yaml": ["x", []]}}', "[]"):
        (tmp_path / "build/bad.json").write_text(text)
        assert discover(str(tmp_path), cache_file=str(tmp_path / "build/bad.json"))[0].steps == 2


def test_inside_resolves_what_a_folder_listing_cannot_vouch_for(tmp_path, monkeypatch):
    """A folder that can be entered but not listed (mode 0711) hides its links from the listing:
    they must still be followed, not taken as plain names."""
    root, out = tmp_path / "repo", tmp_path / "out"
    (root / "noread").mkdir(parents=True)
    out.mkdir()
    os.symlink(str(out), root / "noread" / "w")
    real_scandir = os.scandir

    def scandir(path="."):
        if os.path.basename(os.path.normpath(path)) == "noread":
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)
    monkeypatch.setattr(os, "scandir", scandir)
    assert inside(str(root), "noread/w", Tree(str(root))) is None
    assert inside(str(root), "noread/plain", Tree(str(root))) == "noread/plain"


def test_warm_parse_cache_never_loads_pyyaml(tmp_path):
    (tmp_path / "build").mkdir()
    zoo(tmp_path, {"programs/a.logos": SRC, "programs/a.yaml": "steps: 2\n"})
    code = ("import sys; from emitter.pipeline.config import discover; "
            f"pcs = discover({str(tmp_path)!r}, cache_file={str(tmp_path / 'build/c.json')!r}); "
            "print(pcs[0].steps, 'yaml' in sys.modules)")
    run = lambda: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 cwd=ROOT, check=True).stdout.split()
    assert run() == ["2", "True"]     # cold: parsed
    assert run() == ["2", "False"]    # warm: from the cache, PyYAML never imported


def test_yaml_numbers_as_yaml_1_2_reads_them(tmp_path):
    got = zoo(tmp_path, {"programs/p.logos": SRC,
                         "programs/p.yaml": "tolerances: {float32: {abs: 1e-5, rel: 2E-3}}\n"})
    assert got["p"].error is None
    assert got["p"].tolerances["float32"] == {"abs": 1e-5, "rel": 2e-3}
    got = zoo(tmp_path, {"programs/q.logos": SRC, "programs/q.yaml": "tolerances: {float32: {abs: '1e-5'}}\n"})
    assert "`abs` must be a finite number >= 0, got '1e-5'" in got["q"].error   # quoted: a string
    got = zoo(tmp_path, {"programs/r.logos": SRC, "programs/r.yaml": "steps: 010\nlimits: {seconds: 0x10}\n"})
    assert got["r"].error is None and got["r"].steps == 10 and got["r"].limits["seconds"] == 16   # (not octal 8)


def test_every_bad_bf16_bound_is_said_at_once(tmp_path):
    text = "dtypes: [float64, bfloat16]\nbf16:\n  z: -1\n  cosine: 2\n  excess:\n    matmul: -3\n    nope: 1\n"
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml": text})
    for where, key in ((3, "bf16.z"), (4, "bf16.cosine"), (5, "bf16.excess.matmul"), (5, "bf16.excess.nope")):
        assert f"programs/p.yaml:{where}: `{key}`" in got["p"].error, got["p"].error


def test_bf16_bounds_in_a_config(tmp_path):
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml":
                         "dtypes: [float32, bfloat16]\nbf16: {deviation: 0.3, excess: {matmul: 5}}\n",
                         "programs/q.logos": SRC, "programs/q.yaml": "bf16: {deviatoin: 0.3}\n"})
    assert got["p"].error is None and got["p"].bf16 == {"deviation": 0.3, "excess": {"matmul": 5}}
    from emitter.verify.bf16 import bounds
    b = bounds(got["p"].bf16)
    assert b["deviation"] == 0.3 and b["excess"]["matmul"] == 5 and b["excess"]["attention"] == 4.0
    assert got["q"].error.startswith("programs/q.yaml:1") and "deviation" in got["q"].error


def test_a_root_that_holds_the_repository_or_lies_in_it_is_refused(tmp_path, monkeypatch):
    """`roots:` (and LOGOS_ROOTS) name shared folders outside the repository: `/` or the
    repository's parent would put build/ and every file of the machine in reach (a program linked
    to /proc/self/environ, a weights folder in build/), one inside it is no root. Each is refused at
    its line, failing every program; a root beside the repository is kept."""
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.delenv("LOGOS_ROOTS", raising=False)
    for root, why in (("/", "holds the repository"), ("..", "holds the repository"),
                      (".", "holds the repository"), ("build", "is inside the repository"),
                      (str(repo / "weights"), "is inside the repository")):
        got = zoo(repo, {"programs/defaults.yaml": f"roots: [/srv, {json.dumps(root)}]\n",
                         "programs/p.logos": SRC})
        assert got["p"].error.startswith(f"programs/defaults.yaml:1: `roots`: `{root}` {why}"), got["p"].error
    got = zoo(repo, {"programs/defaults.yaml": "roots: [" + "/srv" * 200_000 + "]\n", "programs/p.logos": SRC})
    assert got["p"].error.startswith("programs/defaults.yaml:1: `roots`: `/srv/srv") and \
        "is a path of 800000 bytes, over the 4096 a file's path can have" in got["p"].error, got["p"].error
    (tmp_path / "shared").mkdir()
    got = zoo(repo, {"programs/defaults.yaml": "roots: [../shared]\n", "programs/p.logos": SRC})
    assert got["p"].error is None
    os.unlink(repo / "programs/defaults.yaml")
    monkeypatch.setenv("LOGOS_ROOTS", str(tmp_path))
    got = zoo(repo, {"programs/p.logos": SRC})
    assert got["p"].error == f"LOGOS_ROOTS: names `{tmp_path}`, which holds the repository (a root is " \
        "a shared folder outside it)", got["p"].error


def test_an_absolute_path_inside_the_repository_is_held_as_its_relative_one(tmp_path):
    """A config's absolute path that lands in the repository is the repository's path (keyed by
    its relative name, under build/'s refusal), whatever the roots."""
    (tmp_path / "shared").mkdir()
    repo = tmp_path / "repo"
    (repo / "weights" / "w").mkdir(parents=True)
    (repo / "build" / "bundles" / "q").mkdir(parents=True)
    assert inside(str(repo), str(repo / "weights" / "w")) == "weights/w"
    assert inside(str(repo), str(repo)) == "."
    got = zoo(repo, {"programs/defaults.yaml": "roots: [../shared]\n", "programs/p.logos": SRC,
                     "programs/p.yaml": f"weights: {repo / 'weights' / 'w'}\n",
                     "programs/q.logos": SRC, "programs/q.yaml": f"weights: {repo / 'build' / 'bundles' / 'q'}\n"})
    assert got["p"].error is None and got["p"].weights == "weights/w"
    assert got["q"].error.startswith(f"programs/q.yaml:1: `weights`: `{repo / 'build' / 'bundles' / 'q'}` "
                                     "is the repository or under build/"), got["q"].error
    (repo / "ck").mkdir()   # a checkpoint too: named as the repository's (the import key's name)
    (repo / "ck" / "m.gguf").write_bytes(b"GGUF")
    got = zoo(repo, {"programs/d.logos": SRC,
                     "programs/d.yaml": f"derive: {{importer: gguf, checkpoint: {repo / 'ck' / 'm.gguf'}}}\n"})
    assert got["d"].error is None and got["d"].derive.checkpoint == "ck/m.gguf", got["d"]


def test_a_link_that_cannot_be_read_fails_only_its_program(tmp_path, monkeypatch):
    """A path through a link that cannot be read (/proc/1/root: EACCES, which os.path.realpath
    raises rather than stops at), as `weights:`, a checkpoint, through a folder linked there, or as
    a root, is refused at its line, failing only the programs it is about; a neighbour builds."""
    real = os.path.realpath

    def realpath(p, *a, **k):   # (a path into /denied, or a link there, cannot be read)
        if "denied" in os.fspath(p) or "denied" in real(p, *a, **k):
            raise PermissionError(13, "Permission denied", os.fspath(p))
        return real(p, *a, **k)
    monkeypatch.setattr(os.path, "realpath", realpath)
    os.makedirs(tmp_path / "weights")
    os.symlink("/denied", tmp_path / "weights" / "link")
    for yaml_text, words in (("weights: /denied/tmp\n", "`weights`: `/denied/tmp` leaves the repository"),
                             ("weights: weights/link/tmp\n", "`weights`: `weights/link/tmp` leaves the repository"),
                             ("derive: {importer: gguf, checkpoint: /denied/x.gguf}\n",
                              "`derive.checkpoint`: `/denied/x.gguf` leaves the repository")):
        got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml": yaml_text, "programs/q.logos": SRC})
        assert got["p"].error.startswith("programs/p.yaml:1: ") and words in got["p"].error, got["p"].error
        assert got["q"].error is None
    got = zoo(tmp_path, {"programs/defaults.yaml": "roots: [/denied/tmp]\n", "programs/p.yaml": "",
                         "programs/p.logos": SRC})
    assert got["p"].error.startswith("programs/defaults.yaml:1: `roots`: `/denied/tmp` cannot be resolved"), \
        got["p"].error
    monkeypatch.setenv("LOGOS_ROOTS", "/denied/tmp")   # (the same through the environment: named)
    got = zoo(tmp_path, {"programs/p.logos": SRC})
    assert got["p"].error == "LOGOS_ROOTS: names `/denied/tmp`, which cannot be resolved (a link on the way " \
        "cannot be read)", got["p"].error
    from emitter.verify.links import refused_link   # (a leaf's file through one: refused, named)
    os.makedirs(tmp_path / "weights" / "q")
    os.symlink("/denied/X.f64", tmp_path / "weights" / "q" / "X.f64")
    monkeypatch.delenv("LOGOS_ROOTS")
    why = refused_link(str(tmp_path / "weights" / "q"), "X.f64")
    assert why is not None and why.startswith("`X.f64` links outside the weights directory") and \
        "through a link that cannot be read" in why, why


def test_a_weights_folder_or_file_linked_into_build_is_refused(tmp_path):
    """build/ is what runs write (another program's lock output, derived weights): a program's
    default weights folder linked there is refused as a config's `weights:` there is, and a leaf's
    file linked there is refused by the lock's link rule, named; a link inside the folder is kept."""
    from emitter.verify.links import refused_link
    os.makedirs(tmp_path / "build" / "w")
    os.makedirs(tmp_path / "weights")
    os.symlink("../build/w", tmp_path / "weights" / "p")
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/q.logos": SRC})
    assert got["p"].error is not None and "`weights/p` is a link under build/" in got["p"].error, got["p"].error
    assert got["q"].error is None
    os.makedirs(tmp_path / "weights" / "q")
    (tmp_path / "build" / "x.f64").write_bytes(b"\0" * 16)
    (tmp_path / "weights" / "q" / "y.f64").write_bytes(b"\0" * 16)
    os.symlink("../../build/x.f64", tmp_path / "weights" / "q" / "x.f64")
    os.symlink("y.f64", tmp_path / "weights" / "q" / "z.f64")
    why = refused_link(str(tmp_path / "weights" / "q"), "x.f64")
    assert why is not None and why.startswith("`x.f64` links into the zoo's build/"), why
    assert refused_link(str(tmp_path / "weights" / "q"), "z.f64") is None


def test_a_refused_config_keeps_the_checks_it_names(tmp_path):
    """A config refused for one key still names its program's checks where its `dtypes:` and
    `lock:` read well: each is an error row (a bfloat16 check vanished from junit instead)."""
    got = zoo(tmp_path, {"programs/p.logos": SRC,
                         "programs/p.yaml": "dtypes: [float64, bfloat16]\nweights: ../outside\n"})
    assert got["p"].error is not None and got["p"].dtypes == ["float64", "bfloat16"], (got["p"].error, got["p"].dtypes)
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml": "lock: false\ncolour: red\n"})
    assert got["p"].error is not None and got["p"].lock is False
    got = zoo(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml": "dtypes: [float16]\n"})   # (unread: the defaults)
    assert got["p"].error is not None and got["p"].dtypes == ["float64", "float32"]
