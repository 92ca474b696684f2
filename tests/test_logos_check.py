"""`logos check` and `logos doit` as users run them: every error of every file in one run, no torch,
GitHub annotations, a pre-commit hook tried with the real pre-commit, the zoo root found upward,
doit's help and completion naming `logos doit CMD`."""

import os
import subprocess
import sys

from conftest import ROOT, logos, write_tree as write

GOOD = "Let x be a 1 by 2 tensor of Real.\nLet y be silu of x.\n"


def bad_zoo(tmp_path):
    return write(tmp_path, {
        "programs/good.logos": GOOD,
        "programs/op.logos": GOOD.replace("silu of x", "x matmull x"),
        "programs/name.logos": GOOD.replace("silu of x", "silu of xs"),
        "programs/name.yaml": "steps: 0\ncolour: red\n",
        "programs/defaults.yaml": "dtypes: [float32, f64]\n",
        ".github/workflows/ci.yaml": "on: push\njobs: {}\n"})


EXPECTED = [
    "programs/defaults.yaml:1: `dtypes`: `f64` is not a dtype; did you mean `float64`?",
    "programs/name.yaml:1: `steps`: must be a positive integer, got 0",
    "programs/name.yaml:2: `colour`: unknown key (known: weights, lock, dtypes, steps, tolerances, "
    "derive, allow_nonfinite, limits, precision, bf16)",
    "programs/name.logos:2: `Let y be silu of xs.`: `silu` reads `xs`, which is not bound on an "
    "earlier line; did you mean `x`?",
    "programs/op.logos:2: `Let y be x matmull x.`: `matmull` is no op; did you mean `matmul`, as in "
    "`Let OUT be A matmul B.`?"]


def test_every_error_of_every_file_in_one_run(tmp_path):
    bad_zoo(tmp_path)
    r = logos("check", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout.splitlines() == EXPECTED, r.stdout
    assert r.stderr.startswith("logos check: 3 program(s), 5 error(s) (")
    # from a folder inside the zoo, paths as reached from there; files named one by one
    r = logos("check", cwd=tmp_path / "programs")
    assert r.stdout.splitlines()[0] == "defaults.yaml:1: `dtypes`: `f64` is not a dtype; did you mean `float64`?"
    write(tmp_path, {"programs/gone.yaml": "steps: 2\n"})
    r = logos("check", "programs/op.logos", "programs/good.logos", ".github/workflows/ci.yaml",
              "programs/gone.yaml", cwd=tmp_path)
    assert r.stdout.splitlines() == [EXPECTED[0], EXPECTED[-1]]
    assert "warning: programs/gone.yaml: a config with no program beside it (no programs/gone.logos): ignored" in r.stderr
    write(tmp_path, {"programs/defaults.yaml": "", "programs/op.logos": GOOD, "programs/name.logos": GOOD,
                     "programs/name.yaml": "steps: 2\n"})
    r = logos("check", cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "")


def test_no_zoo_and_missing_paths_are_one_line_each(tmp_path):
    r = logos("check", cwd=tmp_path)
    assert r.returncode == 2 and "no programs/ folder" in r.stderr and "Traceback" not in r.stderr
    r = logos("check", "nothere.logos", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("nothere.logos: no such file or folder")
    assert "0 program(s), 1 error(s)" in r.stderr, r.stderr
    (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")   # a file that is nothing to check
    r = logos("check", "passwd", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout.startswith("passwd: not a program (NAME.logos)"), r.stdout + r.stderr
    assert "0 program(s), 1 error(s)" in r.stderr, r.stderr
    os.makedirs(tmp_path / "empty")   # a folder named that holds no program is no pass either
    r = logos("check", "empty", cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("empty: no program (NAME.logos) there"), r.stderr
    for cmd in (("emit", "empty", "-o", "out"), ("run", "empty", "--out", "o.json")):   # a folder as a program
        r = logos(*cmd, cwd=tmp_path)
        assert r.returncode == 1 and r.stderr.strip() == "empty: cannot read the program: it is a folder", r.stderr


def test_a_program_that_is_no_file_is_said_once_and_never_waited_on(tmp_path):
    """A FIFO hung `logos check` (a pre-commit hook that never ends); a folder was said twice."""
    write(tmp_path, {"programs/good.logos": GOOD})
    os.mkfifo(tmp_path / "programs/f.logos")
    (tmp_path / "programs/g.logos").mkdir()
    r = subprocess.run([sys.executable, "-m", "emitter", "check"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 1 and r.stdout.splitlines() == [
        "programs/f.logos: cannot read the program: it is not a regular file",
        "programs/g.logos: cannot read the program: it is a folder"], r.stdout
    r = subprocess.run([sys.executable, "-m", "emitter", "check", "programs/f.logos"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 1 and r.stdout.strip() == \
        "programs/f.logos: cannot read the program: it is not a regular file", r.stdout


def test_github_actions_annotations(tmp_path):
    bad_zoo(tmp_path)
    r = logos("check", cwd=tmp_path, env={"GITHUB_ACTIONS": "true"})
    notes = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    assert len(notes) == 5
    assert notes[-1] == ("::error file=programs/op.logos,line=2::`Let y be x matmull x.`: `matmull` is no "
                         "op; did you mean `matmul`, as in `Let OUT be A matmul B.`?")
    assert "::error" not in logos("check", cwd=tmp_path).stdout
    r = logos("check", cwd=tmp_path, env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path.parent)})
    assert f"::error file={tmp_path.name}/programs/op.logos,line=2::" in r.stdout, r.stdout


def test_check_neither_emits_nor_imports_torch_or_numpy(tmp_path):
    bad_zoo(tmp_path)
    code = ("import sys; from emitter.cli import main; rc = main(['check']); "
            "print(rc, 'torch' in sys.modules, 'numpy' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.stderr.splitlines()[-1] == "1 False False", r.stderr
    assert sorted(os.listdir(tmp_path)) == [".github", "programs"]       # nothing written


def test_the_zoo_checks_clean():
    r = logos("check")
    assert (r.returncode, r.stdout) == (0, ""), r.stdout
    n = len([f for f in os.listdir(os.path.join(ROOT, "programs")) if f.endswith(".logos")])
    assert r.stderr.startswith(f"logos check: {n} program(s), 0 error(s)"), r.stderr


def _pre_commit(repo):
    """`pre-commit try-repo` of this checkout's hook, offline: the hook's environment gets the
    package without its dependencies (torch alone is gigabytes); they come from this venv's path."""
    import sysconfig
    env = {**os.environ, "PRE_COMMIT_HOME": str(repo.parent / "pre-commit-home"), "PIP_NO_DEPS": "1",
           "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0",
           "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    return subprocess.run([sys.executable, "-m", "pre_commit", "try-repo", ROOT, "logos-check",
                           "--all-files"], capture_output=True, text=True, cwd=repo, env=env)


def test_pre_commit_hook_fails_a_bad_program_and_passes_a_good_one(tmp_path):
    repo = write(tmp_path / "repo", {"programs/p.logos": GOOD.replace("silu", "sigmod"),
                                     "config.yaml": "anything: [not, a, zoo, config]\n"})
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("add", "-A")
    r = _pre_commit(repo)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "programs/p.logos:2: `Let y be sigmod of x.`: `sigmod` is no op; did you mean `sigmoid`" in r.stdout
    write(repo, {"programs/p.logos": GOOD})
    git("add", "-A")
    r = _pre_commit(repo)
    assert r.returncode == 0 and "logos check" in r.stdout and "Passed" in r.stdout, r.stdout + r.stderr


def test_doit_from_inside_the_zoo_finds_its_root(tmp_path):
    write(tmp_path, {"programs/a.logos": GOOD, "programs/deep/er/note.txt": ""})
    r = logos("doit", "list", cwd=tmp_path / "programs" / "deep" / "er")
    assert r.returncode == 0 and "emit" in r.stdout.split()
    assert r.stderr.startswith(f"logos doit: the zoo at {tmp_path} (the nearest folder above "
                               f"{tmp_path / 'programs' / 'deep' / 'er'} holding programs/)")
    r = logos("doit", "list", cwd=tmp_path)          # at the root: nothing to say
    assert r.returncode == 0 and "the zoo at" not in r.stderr


def test_doit_help_and_errors_name_logos_doit(tmp_path):
    write(tmp_path, {"programs/a.logos": GOOD})
    out = logos("doit", "help", cwd=tmp_path).stdout
    assert "  logos doit clean " in out and "logos doit help <command>" in out
    assert "  logos clean" not in out and "__main__" not in out
    r = logos("doit", "nosuchcmd", cwd=tmp_path)
    assert 'Type "logos doit help" to see available commands.' in r.stderr


def test_doit_tabcompletion_completes_logos_doit(tmp_path):
    """The bash script doit writes, rewritten for `logos doit`, run by bash (bash-completion's
    helpers stubbed: they only split the line)."""
    write(tmp_path, {"programs/a.logos": GOOD})
    script = logos("doit", "tabcompletion", cwd=tmp_path).stdout
    assert "logos doit list" in script and "complete -o filenames -F _logos_doit logos" in script
    assert "logos list" not in script and "logos_doit list" not in script
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "logos").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m emitter "$@"\n')
    (bindir / "logos").chmod(0o755)
    (tmp_path / "complete.sh").write_text(script)
    probe = """
_get_comp_words_by_ref() { cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}";
                           words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; }
__ltrim_colon_completions() { :; }
_filedir() { :; }
source complete.sh
for line in "logos ch" "logos doit cl" "logos doit em" "logos doit info em" "logos check progr" \
            "logos lock programs/a.lo"; do
  read -a COMP_WORDS <<< "$line"; COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=()
  _logos_doit; echo "$line => ${COMPREPLY[*]}"
done
"""
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": ROOT, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    assert r.stdout.splitlines() == ["logos ch => check", "logos doit cl => clean",
                                     "logos doit em => emit", "logos doit info em => emit",
                                     "logos check progr => programs",   # file names, as bash's own
                                     "logos lock programs/a.lo => programs/a.logos"], r.stdout + r.stderr
    zsh = logos("doit", "tabcompletion", "--shell", "zsh", cwd=tmp_path).stdout
    assert zsh.startswith("#compdef logos\n") and "$(logos doit list" in zsh and "shift words" in zsh
    assert "_files" in zsh


def test_a_program_linked_out_of_the_repository_is_refused_unread(tmp_path):
    """A programs/ entry that links to a file outside the repository is refused by name; no line
    of the file it points at reaches the output (a CI log, a GitHub annotation)."""
    write(tmp_path, {"zoo/programs/good.logos": GOOD, "outside/secret.txt": "API_KEY=hunter2\n"})
    os.symlink(tmp_path / "outside/secret.txt", tmp_path / "zoo/programs/leak.logos")
    for args in (("check",), ("check", "programs/leak.logos")):
        r = logos(*args, cwd=tmp_path / "zoo", env={"GITHUB_ACTIONS": "true"})
        out = r.stdout + r.stderr
        assert r.returncode == 1 and "programs/leak.logos" in out and "leaves the repository" in out, out
        assert "hunter2" not in out and "API_KEY" not in out, out


def test_logos_help_says_what_it_does_in_whole_sentences(tmp_path):
    r = logos("--help", cwd=tmp_path)
    text = " ".join(r.stdout.split())
    assert r.returncode == 0 and "read results, import weights, run the zoo's doit tasks." in text, r.stdout


def test_every_sentence_form_is_listed_by_check_forms_which_the_reader_points_to(tmp_path):
    # a wheel's user has no docs/: the message for a sentence of no known start names the command
    from emitter.ops import OPS
    forms = logos("check", "--forms", cwd=tmp_path)
    assert forms.returncode == 0, forms.stderr
    lines = forms.stdout.splitlines()
    assert lines[:2] == ["Let V be a R by C tensor of Real.", "Set item N of V to VALUE."]
    for op in OPS:
        assert any(op.pattern in ln for ln in lines), op.pattern
    write(tmp_path, {"programs/p.logos": "Compute y from x.\n"})
    r = logos("check", cwd=tmp_path)
    assert r.returncode == 1 and "(every form: `logos check --forms`)" in r.stdout, r.stdout


def test_check_names_every_sentence_emission_refuses(tmp_path):
    # read, but no torch call spells it: the pre-commit hook must not pass a sure failure
    write(tmp_path, {"programs/p.logos": "Let x be a 1 by 2 tensor of Real.\nSet item 1 of x to 1.\n"
                                         "Let y be selective scan of x.\nLet z be moe of y.\n"})
    r = logos("check", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"programs/p.logos:{n}: `Let {v} be {op} of {x}.`: `{op}` has no torch spelling in the SambaFlow "
        "emitter: anything outside the tensor sugar is refused, never dropped"
        for n, v, op, x in ((3, "y", "selective scan", "x"), (4, "z", "moe", "y"))], r.stdout


def test_a_programs_weights_name_that_is_no_folder_is_said_so(tmp_path):
    # read as "no weights", the program's error said no weights directory was given
    prog = "Let x be a 1 by 2 tensor of Real.\nLet w be a 2 by 2 tensor of Real.\nLet y be x matmul w.\n"
    write(tmp_path, {"programs/f.logos": prog, "programs/p.logos": prog, "programs/l.logos": prog,
                     "weights/f": "not a folder\n"})
    os.mkfifo(tmp_path / "weights/p")
    os.symlink("nowhere", tmp_path / "weights/l")
    r = logos("check", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout.splitlines() == [
        "programs/f.logos: `weights/f` is there but is not a folder of weights (a file)",
        "programs/l.logos: `weights/l` is there but is not a folder of weights (a link to nowhere: "
        "No such file or directory)",
        "programs/p.logos: `weights/p` is there but is not a folder of weights (a FIFO)"], r.stdout
