"""Every command in the README is run here, so the README cannot drift from what the tool does.

The README's commands are its ```sh blocks; prose names a command in backticks only as the start of
one of those (`logos doit`, `logos lock`), which is checked too. Every block runs with
`bash -euo pipefail` from one scratch folder, in the README's order (a later block uses what an
earlier one made, as in a reader's terminal), offline, with `logos`, `doit` and `python` this
checkout's (shims first on PATH). A ```text block right after a sh block is the terminal's last
lines: the run's last lines (stdout and stderr together) must be those, word for word, each number
within a factor of 2 (the last digits of a float32 error may differ on another CPU).

Excluded, and asserted to be exactly these:
- `bash setup.sh && .venv/bin/doit`, `bash setup.sh --tests && .venv/bin/python -m pytest -q`:
  setup.sh installs from PyPI and Debian (network, minutes), the main job locks the real models,
  and the second runs this whole suite; CI runs it through .ci/run, asserted here to hold it as the
  README says.
- `pip install .`, `pip install '.[dask,cache,import,tiny]'`, `pip wheel --no-deps . -w dist/`: they need the
  registry and would change the environment the tests run in; tests/test_package.py builds the
  wheel, installs it into a clean venv and runs `logos doit`, tests/test_extras.py the refusals.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

README = os.path.join(ROOT, "README.md")
EXCLUDED = [
    "bash setup.sh && .venv/bin/doit",
    "bash setup.sh --tests && .venv/bin/python -m pytest -q",
    "pip install .",
    "pip install '.[dask,cache,import,tiny]'",
    "pip wheel --no-deps . -w dist/",
]
COMMAND_WORDS = ("logos", "doit", "pip", "python", "bash", ".venv/bin/")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def blocks(text):
    """[(language, body)] of the fenced blocks, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M)]


def commands(body):
    """The command lines of a sh block: heredoc bodies and comments left out."""
    lines, heredoc = [], None
    for line in body.splitlines():
        if heredoc is not None:
            heredoc = None if line == heredoc else heredoc
            continue
        m = re.search(r"<<'?(\w+)'?", line)
        heredoc = m.group(1) if m else None
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def runs(text):
    """[(sh body, the text block that shows its last lines or None)], excluded blocks left out."""
    out, bs = [], blocks(text)
    for i, (lang, body) in enumerate(bs):
        if lang != "sh" or all(c in EXCLUDED for c in commands(body)):
            continue
        shown = bs[i + 1][1] if i + 1 < len(bs) and bs[i + 1][0] == "text" else None
        out.append((body, shown))
    return out


def same_lines(got, shown):
    """`got` is `shown` word for word, integers exact, each other number within a factor of 2 (same
    sign)."""
    if len(got) != len(shown):
        return False
    for g, s in zip(got, shown):
        if NUMBER.sub("#", g) != NUMBER.sub("#", s):
            return False
        for a, b in zip(NUMBER.findall(g), NUMBER.findall(s)):
            exact = a.lstrip("-").isdigit() or b.lstrip("-").isdigit()
            a, b = float(a), float(b)
            if not (a == b or (not exact and a * b > 0 and 0.5 <= a / b <= 2)):
                return False
    return True


def test_the_excluded_commands_are_exactly_the_setup_and_install_ones():
    text = open(README, encoding="utf-8").read()
    every = [c for lang, body in blocks(text) if lang == "sh" for c in commands(body)]
    assert [c for c in every if c.startswith(("bash setup.sh", "pip "))] == EXCLUDED
    for lang, body in blocks(text):          # an excluded command never hides a runnable one
        cs = commands(body) if lang == "sh" else []
        assert not any(c in EXCLUDED for c in cs) or all(c in EXCLUDED for c in cs), cs
    # the two fresh-machine commands are in the first screen, and CI runs the README's test command
    assert all(text.index(c) < text.index("## A first program") for c in EXCLUDED[:2])
    ci = open(os.path.join(ROOT, ".ci/run")).read().splitlines()
    assert EXCLUDED[1] in ci


def test_commands_named_in_prose_are_commands_of_a_block():
    text = open(README, encoding="utf-8").read()
    prose = re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M)
    run = [c for lang, body in blocks(text) if lang == "sh" for c in commands(body)]
    named = [s for s in re.findall(r"`([^`\n]+)`", prose) if s.startswith(COMMAND_WORDS)]
    assert named, "the prose names no command"
    for s in named:
        assert any(c == s or c.startswith(s + " ") for c in run), f"`{s}` is in no sh block"


def test_same_lines_takes_float_noise_and_nothing_else():
    line = "hello PASS: at 2.33e-05× its tolerance; 1−cos 0"
    assert same_lines([line], [line])
    assert same_lines([line], ["hello PASS: at 2.41e-05× its tolerance; 1−cos 0"])
    assert not same_lines([line], ["hello PASS: at 2.33e-03× its tolerance; 1−cos 0"])
    assert not same_lines([line], ["hello FAIL: at 2.33e-05× its tolerance; 1−cos 0"])
    assert not same_lines([line], [line, line])
    assert not same_lines(["2 checks: 2 pass"], ["3 checks: 3 pass"])


@pytest.fixture
def terminal(tmp_path):
    """A scratch folder and an offline environment whose logos, doit and python are this checkout's."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, run in (("logos", "-m emitter"), ("doit", "-m doit"), ("python", "")):
        (bindir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {run} "$@"\n')
        (bindir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ROOT,
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LOGOS_PROGRESS": "names"}
    for var in ("LOGOS_CACHE_KEY", "GITHUB_ACTIONS"):
        env.pop(var, None)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return scratch, env


def test_every_command_of_the_readme_runs_and_prints_what_the_readme_shows(terminal):
    scratch, env = terminal
    steps = runs(open(README, encoding="utf-8").read())
    assert len(steps) >= 3 and sum(shown is not None for _, shown in steps) >= 2
    for body, shown in steps:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=scratch, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        assert done.returncode == 0, f"{body}\n--- exit {done.returncode}:\n{done.stdout}"
        if shown is not None:
            want = shown.rstrip("\n").splitlines()
            got = done.stdout.rstrip("\n").splitlines()[-len(want):]
            assert same_lines(got, want), "the README shows:\n" + "\n".join(want) + \
                "\nthe terminal's last lines are:\n" + "\n".join(got)
    assert (scratch / "hello/build/report.html").is_file()
