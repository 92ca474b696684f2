"""Messages as a user meets them through the CLI: the nearest known op, name, key or dtype; a
config's every error at its YAML line; shared storage roots; dtypes spelt as users spell them."""

import json
import os
import re

import numpy as np

from conftest import logos, write_tree as write

SRC = "Let x be a 1 by 2 tensor of Real.\nLet W be a 2 by 2 tensor of Real.\nLet y be x matmul W.\n"


def forms(message):
    return re.findall(r"`(?:Let OUT be|Set|Let V be)[^`]*`", message)


def test_a_misspelt_op_gets_the_nearest_one_and_its_form(tmp_path):
    prog = write(tmp_path, {"p.logos": SRC.replace("matmul", "matmull")}) / "p.logos"
    r = logos("emit", str(prog), "-o", str(tmp_path / "b"))
    line = r.stderr.strip()
    assert r.returncode == 1 and "\n" not in line and len(line) < 300, line
    assert line == (f"{prog}:3: `Let y be x matmull W.`: `matmull` is no op; did you mean `matmul`, "
                    "as in `Let OUT be A matmul B.`?")


def test_an_unknown_op_gets_at_most_three_forms_under_300_characters(tmp_path):
    for sentence in ("Let y be foo of x.", "Let y be frobnicate x with W over 2 taps and more words.",
                     "Let y be " + "word " * 60 + "."):
        write(tmp_path, {"programs/p.logos": SRC.replace("Let y be x matmul W.", sentence)})
        r = logos("emit", "programs/p.logos", "-o", "b", cwd=tmp_path)
        line = r.stderr.strip()
        assert r.returncode == 1 and len(line) < 300 and 1 <= len(forms(line)) <= 3, line
        assert "no op the reader knows; the nearest forms: " in line
    prog = write(tmp_path, {"p.logos": SRC.replace("Let y be x matmul W.", "Let y be foo of x.")}) / "p.logos"
    assert forms(logos("emit", str(prog), "-o", str(tmp_path / "b")).stderr)[:2] == [
        "`Let OUT be sigmoid of X.`", "`Let OUT be softmax of X.`"]     # `… of X` forms, nearest first


def test_misspelt_names_and_sentence_starts_get_the_nearest(tmp_path):
    cases = {"Let y be x matmul Wq.": "`matmul` reads `Wq`, which is not bound on an earlier line; "
                                      "did you mean `W`?",
             "Lett y be x matmul W.": "a sentence starts with `Let`, `Set` or `Show`; did you mean `Let`?",
             "Set item 1 of w to 2.": "fills `w`, which is not declared on an earlier line; did you mean `W`?"}
    for sentence, words in cases.items():
        prog = write(tmp_path, {"p.logos": SRC.replace("Let y be x matmul W.", sentence + "\nLet z be silu of x.")}) / "p.logos"
        r = logos("emit", str(prog), "-o", str(tmp_path / "b"))
        assert r.returncode == 1 and words in r.stderr, r.stderr
    prog = write(tmp_path, {"p.logos": "Let x be a 1 by 2 tensor of real.\n"}) / "p.logos"
    assert "not `real`; did you mean `Real`?" in logos("emit", str(prog), "-o", str(tmp_path / "b")).stderr


def test_a_config_reports_every_error_at_its_line(tmp_path):
    write(tmp_path, {"programs/p.logos": SRC, "programs/p.yaml":
                     "stpes: 2\ndtypes: [float6]\nlimits: {secnds: 5}\nweights: weights/nothere\n"
                     "tolerances:\n  float32: {abs: -1}\nlock: maybe\n"})
    r = logos("check", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "programs/p.yaml:1: `stpes`: unknown key; did you mean `steps`?",
        "programs/p.yaml:2: `dtypes`: `float6` is not a dtype; did you mean `float64`?",
        "programs/p.yaml:3: `limits.secnds`: `secnds` is not a limit; did you mean `seconds`?",
        "programs/p.yaml:4: `weights`: `weights/nothere` is not a directory",
        "programs/p.yaml:6: `tolerances.float32`: `abs` must be a finite number >= 0, got -1",
        "programs/p.yaml:7: `lock`: must be true or false, got 'maybe'"]


def test_logos_run_names_the_program_and_dtypes_as_users_spell_them(tmp_path):
    prog = write(tmp_path, {"p.logos": SRC}) / "p.logos"
    r = logos("run", str(prog), "--out", str(tmp_path / "o.f64"))
    assert r.returncode == 1 and r.stderr.startswith(f"{prog}:1: the input `x` is read"), r.stderr
    w = tmp_path / "w"
    w.mkdir()
    np.zeros(3).tofile(w / "x.f64")
    np.zeros(4).tofile(w / "W.f64")
    r = logos("run", str(prog), "--weights", str(w), "--out", str(tmp_path / "o.f64"))
    assert r.returncode == 1 and "expected 16 bytes of float64, the file has 24" in r.stderr
    assert "f8" not in r.stderr
    r = logos("run", str(prog), "--stage", f"yy={tmp_path / 's.f64'}", "--out", str(tmp_path / "o.f64"))
    assert r.returncode == 2 and r.stderr.strip().endswith("has no stage `yy` (a stage is the name an "
                                                           "op's `Let` binds); did you mean `y`?")
    (tmp_path / "d").mkdir()   # a folder where an output goes: said before any output is written
    r = logos("run", str(prog), "--stage", f"y={tmp_path / 'd'}", "--out", str(tmp_path / "o2.f64"))
    assert r.returncode == 2 and r.stderr.strip() == f"{tmp_path / 'd'}: is a folder, where an output file is to be written"
    assert not (tmp_path / "o2.f64").exists()
    (tmp_path / "f").write_text("mine")   # a file where --state-out's folder goes: the same
    r = logos("run", str(prog), "--weights", str(w), "--state-out", str(tmp_path / "f"),
              "--out", str(tmp_path / "o2.f64"))
    assert r.returncode == 2 and r.stderr.strip() == \
        f"{tmp_path / 'f'}: is a file, where the --state-out folder is to be written", r.stderr
    assert not (tmp_path / "o2.f64").exists() and (tmp_path / "f").read_text() == "mine"


def _zoo_with_linked_weights(tmp_path):
    """A zoo whose weights/p is a link to a folder outside the repository: a shared mount."""
    repo, shared = tmp_path / "repo", tmp_path / "mnt" / "models"
    write(repo, {"programs/p.logos": SRC, "programs/p.yaml": "weights: weights/big\n"})
    (shared / "big").mkdir(parents=True)
    np.arange(2.0).tofile(shared / "big" / "x.f64")
    np.eye(2).tofile(shared / "big" / "W.f64")
    (repo / "weights").mkdir()
    os.symlink(shared / "big", repo / "weights" / "big")
    return repo, shared


def test_weights_outside_the_repository_need_a_named_root(tmp_path):
    repo, shared = _zoo_with_linked_weights(tmp_path)
    r = logos("check", cwd=repo)
    assert r.returncode == 1 and r.stdout.startswith(
        "programs/p.yaml:1: `weights`: `weights/big` leaves the repository (a shared folder outside "
        "it may be named in programs/defaults.yaml `roots:` or LOGOS_ROOTS)"), r.stdout
    assert logos("check", cwd=repo, env={"LOGOS_ROOTS": f"/nowhere{os.pathsep}{shared}"}).returncode == 0
    write(repo, {"programs/defaults.yaml": f"roots: [{tmp_path / 'mnt'}]\n"})
    assert logos("check", cwd=repo).returncode == 0
    # a path that leaves every named root is still refused, at its line
    write(repo, {"programs/p.yaml": "steps: 1\nweights: /etc\n"})
    r = logos("check", cwd=repo)
    assert r.returncode == 1 and r.stdout.startswith(
        f"programs/p.yaml:2: `weights`: `/etc` leaves the repository and every named root ({tmp_path / 'mnt'})")


def test_the_zoo_locks_weights_from_a_named_root(tmp_path):
    repo, shared = _zoo_with_linked_weights(tmp_path)
    write(repo, {"programs/p.yaml": f"weights: {shared / 'big'}\ndtypes: [float64]\n",
                 "programs/defaults.yaml": f"roots: [{shared}]\n"})
    r = logos("doit", cwd=repo)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((repo / "build" / "results" / "p" / "float64.json").read_text())
    assert result["verdict"] == "pass" and result["weights"] == os.path.realpath(shared / "big")
    assert "1 pass, 0 fail, 0 error" in (repo / "build" / "summary.md").read_text()


def test_a_program_linked_inside_the_repository_is_followed(tmp_path):
    write(tmp_path, {"src/real.logos": SRC, "programs/q.logos": SRC})
    os.symlink("../src/real.logos", tmp_path / "programs" / "alias.logos")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.logos"
    outside.write_text(SRC)
    os.symlink(outside, tmp_path / "programs" / "up.logos")   # a link out: still refused
    r = logos("check", cwd=tmp_path)
    assert r.stdout.splitlines() == ["programs/up.logos: `programs/up.logos` leaves the repository "
                                     "(a shared folder outside it may be named in programs/defaults.yaml "
                                     "`roots:` or LOGOS_ROOTS) (a link?)"], r.stdout
    os.unlink(tmp_path / "programs" / "up.logos")
    assert logos("check", cwd=tmp_path).returncode == 0


def test_a_character_that_is_not_printable_is_shown_as_its_escape(tmp_path):
    """A NUL in a name or a value reaches neither the terminal raw nor as a blank: it is `\\x00`."""
    from emitter.language.errors import ProgramError
    from emitter.language.reader import read_program
    for text, shown in (("Let x be a 1 by 2 tensor of Real.\nLet h\0 be silu of x.\n", "`h\\x00`"),
                        ("Let x be a 1 by 2 tensor of Real.\nSet item 1 of x to 3\0.\n", "got `3\\x00`"),
                        ("Let x be a 1 by 2 tensor of Real.\nLet y\x07 be silu of x.\n", "`y\\x07`")):
        try:
            read_program(text)
        except ProgramError as e:
            assert shown in str(e) and "\0" not in str(e) and "\x07" not in str(e), str(e)
        else:
            raise AssertionError(f"read: {text!r}")
