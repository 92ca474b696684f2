"""A weights folder's file that is a link out of the folder, as `logos run` meets it: followed when
its target is inside the repository or a named root (programs/defaults.yaml `roots:`,
LOGOS_ROOTS), refused naming the file and its target otherwise; the value read is the target's."""

import os

import numpy as np
import pytest

from conftest import logos

PROGRAM = """Let x be a 1 by 3 tensor of Real.
Let W be a 3 by 2 tensor of Real.
Let y be x matmul W.
"""
X, W = np.array([[1.0, 2.0, -0.5]]), np.array([[1.0, 2.0], [0.5, -1.0], [4.0, 0.25]])


@pytest.fixture
def zoo(tmp_path):
    """tmp/zoo (a repository: it holds programs/) with weights/p/x.f64 a plain file, and W's
    file in tmp/zoo/shared and in tmp/outside, which is no part of the repository."""
    root = tmp_path / "zoo"
    (root / "programs").mkdir(parents=True)
    (root / "programs" / "p.logos").write_text(PROGRAM)
    (root / "weights" / "p").mkdir(parents=True)
    X.astype("<f8").tofile(root / "weights" / "p" / "x.f64")
    for folder in (root / "shared", tmp_path / "outside"):
        folder.mkdir()
        W.astype("<f8").tofile(folder / "W.f64")
    return root


def _run(root, env=None):
    out = root / "y.bin"
    done = logos("run", "programs/p.logos", "--weights", "weights/p", "--out", str(out), cwd=str(root),
                 env=env)
    return done, (np.fromfile(out, "<f8") if out.exists() else None)


def _link(root, target):
    os.symlink(target, root / "weights" / "p" / "W.f64")


def test_a_link_inside_the_repository_is_followed(zoo):
    _link(zoo, os.path.join("..", "..", "shared", "W.f64"))
    done, y = _run(zoo)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(y, (X @ W).ravel())


def test_a_link_leaving_the_repository_is_refused_naming_file_and_target(zoo):
    target = os.path.realpath(zoo.parent / "outside" / "W.f64")
    _link(zoo, target)
    done, y = _run(zoo)
    assert done.returncode == 1 and y is None
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"weights/p: `W.f64` links outside the weights directory, to `{target}`, "
                           "which is outside the repository and every named root")
    assert "LOGOS_ROOTS" in line


def test_a_link_into_a_root_named_by_the_environment_is_followed(zoo):
    _link(zoo, os.path.realpath(zoo.parent / "outside" / "W.f64"))
    done, y = _run(zoo, env={"LOGOS_ROOTS": str(zoo.parent / "outside")})
    assert done.returncode == 0, done.stderr
    assert np.array_equal(y, (X @ W).ravel())


def test_a_link_into_a_root_named_by_defaults_yaml_is_followed(zoo):
    _link(zoo, os.path.realpath(zoo.parent / "outside" / "W.f64"))
    (zoo / "programs" / "defaults.yaml").write_text("roots: [../outside]\n")
    done, y = _run(zoo)
    assert done.returncode == 0, done.stderr
    assert np.array_equal(y, (X @ W).ravel())
    (zoo / "programs" / "defaults.yaml").write_text("roots: [../elsewhere]\n")
    done, y = _run(zoo)
    assert done.returncode == 1 and "links outside the weights directory" in done.stderr


BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text", [BOMB + "roots: [../outside]\n", "roots: [../outside]\n" + "#" * (2 << 20) + "\n",
                                  "roots: [../outside]\nroots: [../outside]\n"])
def test_a_defaults_yaml_refused_as_a_config_names_no_root(zoo, text):
    """The roots a link may reach are read from defaults.yaml as every config is: an alias bomb,
    a file over the size limit or a key given twice names no root (in moments, the link refused)."""
    _link(zoo, os.path.realpath(zoo.parent / "outside" / "W.f64"))
    (zoo / "programs" / "defaults.yaml").write_text(text)
    done, y = _run(zoo)
    assert done.returncode == 1 and "links outside the weights directory" in done.stderr, done.stderr


@pytest.mark.parametrize("roots", ["roots: [/]\n", "roots: [..]\n", None])
def test_a_root_that_holds_the_repository_lets_no_link_out(zoo, roots):
    """`/` or the repository's parent as a root (defaults.yaml or LOGOS_ROOTS) would let a weights
    file link anywhere: such a root counts as none, and the link is refused."""
    _link(zoo, os.path.realpath(zoo.parent / "outside" / "W.f64"))
    if roots:
        (zoo / "programs" / "defaults.yaml").write_text(roots)
    done, y = _run(zoo, env=None if roots else {"LOGOS_ROOTS": "/"})
    assert done.returncode == 1 and y is None and "links outside the weights directory" in done.stderr, done.stderr
