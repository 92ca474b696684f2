"""Config discovery and validation: every refusal names the file, line and key, and only that
program carries the error."""

import os

import pytest

from emitter.config import ConfigError, discover, load_defaults, resolve_package_file


def zoo(tmp_path, files):
    (tmp_path / "programs").mkdir(exist_ok=True)
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return {pc.name: pc for pc in discover(str(tmp_path))}


SRC = "Let x be a 1 by 2 tensor of Real.\nLet y be sigmoid of x.\n"


@pytest.mark.parametrize("yaml_text, where, words", [
    ("colour: red\n", "programs/p.yaml:1", "`colour`: unknown key"),
    ("steps: 2\nsteps_: 1\n", "programs/p.yaml:2", "`steps_`"),
    ("steps: '2'\n", "programs/p.yaml:1", "`steps`: must be a positive integer"),
    ("steps: true\n", "programs/p.yaml:1", "`steps`: must be a positive integer"),
    ("lock: yes please\n", "programs/p.yaml:1", "`lock`: must be true or false"),
    ("dtypes: [float16]\n", "programs/p.yaml:1", "`float16` is not one of"),
    ("tolerances:\n  float32: {abs: -1}\n", "programs/p.yaml:2", "`tolerances.float32`"),
    ("weights: ../outside\n", "programs/p.yaml:1", "`weights`: `../outside` leaves the repository"),
    ("weights: /etc\n", "programs/p.yaml:1", "leaves the repository"),
    ("derive: {importer: gguf, checkpoint: ../../x.gguf}\n", "programs/p.yaml:1",
     "`derive.checkpoint`: `../../x.gguf` leaves the repository"),
    ("derive: {importer: 'bad name', checkpoint: x}\n", "programs/p.yaml:1", "`derive.importer`"),
    ("derive: {importer: gguf, checkpoint: 'package:yaml/../../x'}\n", "programs/p.yaml:1",
     "leaves the package"),
    ("!!python/object/apply:os.system ['true']\n", "programs/p.yaml", "not valid YAML"),
    ("- a\n- b\n", "programs/p.yaml:1", "a mapping of keys"),
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


def test_names_and_orphans(tmp_path):
    got = zoo(tmp_path, {"programs/has space.logos": SRC, "programs/ok.logos": SRC,
                         "programs/lonely.yaml": "steps: 1\n"})
    assert "not a plain program name" in got["has space"].error
    assert "no program beside it" in got["lonely"].error
    assert got["ok"].error is None


def test_defaults_and_overrides(tmp_path):
    os.makedirs(tmp_path / "weights" / "p")
    got = zoo(tmp_path, {"programs/defaults.yaml": "steps: 3\ntolerances: {float32: {abs: 0.5}}\n",
                         "programs/p.logos": SRC, "programs/q.logos": SRC,
                         "programs/q.yaml": "dtypes: float32\nsteps: 1\nweights: data/q\n"})
    p, q = got["p"], got["q"]
    assert (p.steps, p.dtypes, p.weights, p.weights_required) == (3, ["float64", "float32"],
                                                                  "weights/p", False)
    assert p.tolerance("float32") == (0.5, 1e-3)
    assert (q.steps, q.dtypes, q.weights, q.weights_required) == (1, ["float32"], "data/q", True)
    d = load_defaults(str(tmp_path))
    assert d["lock"] is True


def test_bad_defaults_fail_every_program(tmp_path):
    got = zoo(tmp_path, {"programs/defaults.yaml": "weights: x\n", "programs/p.logos": SRC})
    assert got["p"].error.startswith("programs/defaults.yaml:1: `weights`: unknown key")


def test_package_checkpoint_resolves_inside_the_package(tmp_path):
    path = resolve_package_file("yaml/__init__.py")
    assert os.path.isfile(path) and path.endswith(os.path.join("yaml", "__init__.py"))
    with pytest.raises(ValueError, match="not installed"):
        resolve_package_file("no_such_module_xyz/a.bin")
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
    assert "programs/b.yaml" in got["b"].error and "cannot read the config" in got["b"].error


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
