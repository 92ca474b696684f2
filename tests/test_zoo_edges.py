"""A zoo from many hands, run with real doit: links in programs/ that lead nowhere, a dodo task of
the user's that makes a program's weights, a root named then dropped, a commit, a run stopped
before its report, a config spelt `.yml`, `logos results` from a folder inside the zoo."""

import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import logos
from test_pipeline import PROG_A, PROG_B, ROOT, _weights, doit, make_zoo

HELLO = """Let x be a 1 by 2 tensor of Real.
Set item 1 of x to 3.
Set item 2 of x to 4.
Let W be a 2 by 2 tensor of Real.
Set item 1 of W to 1.
Set item 2 of W to 0.5.
Set item 3 of W to -1.
Set item 4 of W to 2.
Let h be x matmul W.
Let y be rmsnorm of h.
"""


def _copying_task(zoo, name, src, dst):
    """A task of the dodo's own, `name`, that copies `src` to `dst` (its file_dep and target)."""
    with open(zoo / "dodo.py", "a") as f:
        f.write(f"\n\ndef task_{name}():\n    return {{'actions': ['cp {src} {dst}'], 'file_dep': ['{src}'],\n"
                f"            'targets': ['{dst}']}}\n")


def _report(zoo):
    return {(r["name"], r["check"]): r for r in json.loads((zoo / "build/report.json").read_text())["results"]}


def test_links_in_programs_that_lead_nowhere_are_error_rows_beside_the_others(tmp_path):
    """A program linked in a loop, one whose target is gone and a config linked in a loop each get
    an error row naming the file and why; the good program still gets its verdicts, and an
    editor's hidden lock link (`.#NAME.logos`, dangling) is no program."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None), "c": (PROG_B, None)})
    p = z / "programs"
    os.symlink("loop.logos", p / "loop.logos")
    os.symlink("../vendor/gone.logos", p / "gone.logos")
    os.symlink("c.yaml", p / "c.yaml")
    os.symlink("/nowhere/at/all", p / ".#b.logos")
    (p / "dir.logos").mkdir()
    rc, ran, out = doit(z)
    assert rc == 1 and "Traceback" not in out, out
    rows = _report(z)
    assert sorted({n for n, _ in rows}) == ["b", "c", "dir", "gone", "loop"]
    assert "programs/dir.logos: cannot read the program: it is a folder" in rows[("dir", "float32")]["reason"]
    assert rows[("b", "float64")]["verdict"] == "pass"
    why = {n: rows[(n, "float64")] for n in ("c", "gone", "loop")}
    assert all(r["verdict"] == "error" for r in why.values())
    assert "programs/loop.logos: cannot read the program: Too many levels of symbolic links" in why["loop"]["reason"]
    assert "programs/gone.logos: cannot read the program: No such file or directory (a link to " \
           "../vendor/gone.logos)" in why["gone"]["reason"]
    assert "programs/c.yaml: cannot read the config: Too many levels of symbolic links" in why["c"]["reason"]
    done = logos("results", cwd=str(z))
    assert done.returncode == 1 and "no lock history" not in done.stderr


def test_a_dodo_task_that_makes_a_programs_weights_runs_before_its_lock(tmp_path):
    """The user's dodo task writes weights/hello/ (absent when the run starts): doit runs it before
    the lock, the lock reads what it wrote, and the report is about those weights."""
    z = make_zoo(tmp_path / "zoo", {"hello": (HELLO, "tolerances:\n  float32: {abs: 1.0e-7, rel: 0}\n")})
    (z / "gen.py").write_text("import numpy as np, os, sys\nos.makedirs('weights/hello', exist_ok=True)\n"
                              "np.array([[float(sys.argv[1]), 0.7]]).tofile('weights/hello/x.f64')\n")
    with open(z / "dodo.py", "a") as f:
        f.write("\n\ndef task_gen():\n    return {'actions': ['%s gen.py 0.1'], 'file_dep': ['gen.py'],\n"
                "            'targets': ['weights/hello/x.f64']}\n" % os.sys.executable)
    rc, ran, out = doit(z)
    lines = [x[3:] for x in out.splitlines() if x.startswith(".  ")]
    assert lines.index("gen") < lines.index("lock:hello"), out
    r = json.loads((z / "build/results/hello/float32.json").read_text())
    assert r["inputs"]["weights"]["files"].keys() == {"x.f64"}
    rows = _report(z)
    assert rc == 1 and rows[("hello", "float32")]["verdict"] == "fail", out   # 1.29x its tolerance
    assert rows[("hello", "float64")]["verdict"] == "pass"
    assert rows[("hello", "float64")]["current"] is True
    done = logos("results", "--json", cwd=str(z))
    assert all(x["current"] for x in json.loads(done.stdout)["runs"]), done.stdout


def test_dropping_the_root_a_weights_link_needs_moves_its_key(tmp_path):
    """A leaf linked into a root LOGOS_ROOTS names passes; run without the root, the check is not
    current and is locked again (refused), and with the root back it passes again."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None)})
    shared = tmp_path / "shared"
    shared.mkdir()
    np.random.default_rng(0).standard_normal((4, 4)).astype("<f8").tofile(shared / "w.f64")
    (z / "weights" / "a").mkdir(parents=True)
    os.symlink(shared / "w.f64", z / "weights" / "a" / "w.f64")
    root = {"LOGOS_ROOTS": str(shared)}
    assert doit(z, env=root)[0] == 0
    assert doit(z, env=root)[1] == set()
    rc, ran, out = doit(z)
    assert rc == 1 and "lock:a" in ran, out
    assert "links outside the weights directory" in _report(z)[("a", "float64")]["reason"]
    rc, ran, out = doit(z, env=root)
    assert rc == 0 and "lock:a" in ran, out


def _git(z, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=z, check=True,
                   capture_output=True)


def test_a_commit_rewrites_the_reports_that_name_the_commit(tmp_path):
    """The report's headers name the commit: after a commit of a file no check reads, a run writes
    them again (no lock), so junit.xml and report.json name the new HEAD."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / ".gitignore").write_text("build/\n__pycache__/\n")
    _git(z, "init", "-q")
    _git(z, "add", "-A")
    _git(z, "commit", "-qm", "one")
    _git(z, "pack-refs", "--all")   # HEAD's ref read from packed-refs
    assert doit(z)[0] == 0
    (z / "NOTES").write_text("x\n")
    _git(z, "add", "NOTES")
    _git(z, "commit", "-qm", "two")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=z, capture_output=True, text=True).stdout.strip()
    rc, ran, out = doit(z)
    assert rc == 0 and ran == {"report"}, out
    props = {p.get("name"): p.get("value") for p in ET.parse(z / "build/junit.xml").iter("property")}
    assert props["commit"] == head
    assert doit(z)[1] == set()   # and then a no-op


def test_a_run_stopped_before_its_report_sums_up_no_verdicts(tmp_path):
    """A run interrupted before the report (a task of the user's dodo that makes b's weights, so
    run before b's lock, stops it) prints no verdict line: the last report's `N checks: N pass`
    is about an earlier run."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z)[0] == 0
    with open(z / "dodo.py", "a") as f:
        f.write("\n\ndef _stop():\n    raise KeyboardInterrupt\n\n\n"
                "def task_stop():\n    return {'actions': [_stop], 'targets': ['weights/b/x.f64']}\n")
    rc, ran, out = doit(z)
    assert rc != 0 and "doit: interrupted" in out and "lock:b" not in ran, out
    assert "checks:" not in out, out


def test_a_config_spelt_yml_is_named_as_not_read(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "programs" / "b.yml").write_text("dtypes: [float32]\n")
    rc, ran, out = doit(z)
    assert rc == 0
    assert "warning: programs/b.yml: not read (a config is NAME.yaml" in out and "rename it to b.yaml" in out


def test_a_hidden_program_file_is_named_as_not_read(tmp_path):
    # no task and no row: said, by the run and by `logos check` alike (an editor's lock is not)
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    for hidden in (".b2.logos", "..logos"):
        (z / "programs" / hidden).write_text(PROG_B)
    os.symlink("user@host.1234", z / "programs" / ".#b.logos")
    said = ["warning: programs/..logos: a hidden file is not a program: ignored",
            "warning: programs/.b2.logos: a hidden file is not a program: ignored"]
    rc, ran, out = doit(z)
    assert rc == 0 and [ln for ln in out.splitlines() if "hidden" in ln or ".#" in ln] == said, out
    r = logos("check", cwd=z)
    assert r.returncode == 0 and r.stderr.splitlines()[:-1] == said, r.stderr


def test_results_from_a_folder_inside_the_zoo_reads_the_zoos(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z)[0] == 0
    done = logos("results", "--json", cwd=str(z / "programs"))
    assert done.returncode == 0, done.stderr
    assert {(r["name"], r["dtype"]) for r in json.loads(done.stdout)["runs"]} == {("b", "float64"), ("b", "float32")}
    assert f"the zoo at {z}" in done.stderr


def test_a_renamed_programs_kept_verdict_names_its_new_files(tmp_path):
    """A program renamed keeps its verdicts by key; its result names the program and bundle as
    they are now, not the old name's."""
    z, new = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)}), "c"
    assert doit(z)[0] == 0
    old = json.loads((z / "build/results/b/float32.json").read_text())
    os.rename(z / "programs" / "b.logos", z / "programs" / f"{new}.logos")
    rc, ran, out = doit(z)
    assert rc == 0, out
    r = json.loads((z / f"build/results/{new}/float32.json").read_text())
    assert (r["name"], r["program_path"], r["bundle"]) == (new, f"programs/{new}.logos", f"build/bundles/{new}")
    assert r["key"] == old["key"] and r["timings"] == old["timings"]   # the verdict kept, not run again


@pytest.mark.parametrize("key, value, said", [
    ("rms_norm_eps", 1e-5, "rms_norm_eps 1e-05 with Gated DeltaNet layers"),
    # a size that is no positive whole number was a TypeError or a reshape naming the weights
    ("hidden_size", 2.5, "hidden_size 2.5 is not a positive whole number"),
    ("hidden_size", "8", "hidden_size '8' is not a positive whole number"),
    ("num_attention_heads", 0, "num_attention_heads 0 is not a positive whole number"),
    ("num_hidden_layers", True, "num_hidden_layers True is not a positive whole number"),
    ("rope_theta", "big", "rope_theta 'big' is not a positive number"),
    ("layer_types", ["full_attention"], "layer_types is not a list of 4 layer kinds"),
])
def test_a_qwen35_config_the_sugar_cannot_spell_is_named_as_config_json(tmp_path, key, value, said):
    """An importer's refusal of what config.json says names config.json and the value, not the
    weights file."""
    ck = tmp_path / "qwen38-tiny"
    shutil.copytree(os.path.join(ROOT, "checkpoints", "qwen38-tiny"), ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg.get("rope_parameters", {}).pop(key, None)
    cfg[key] = value
    (ck / "config.json").write_text(json.dumps(cfg))
    done = logos("import-qwen35", str(ck / "model.safetensors"), "--program",
                 os.path.join(ROOT, "programs", "qwen38.logos"), "-o", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.startswith(f"{ck / 'config.json'}: this Qwen3_5 config cannot be spelt by the "
                                  f"tensor sugar: {said}"), done.stderr
    assert not (tmp_path / "out").exists()


DYING = '''
from emitter.pipeline import executors


class Dying(executors.Inline):
    """The first check of each lock lost with its worker; the others run."""
    def run(self, jobs, seconds):
        out = super().run(jobs, seconds)
        out[0] = {"error": "lock b [float64]: worker tcp://10.0.0.9:4000 died while running it",
                  "infrastructure": True}
        return out


executors.executor = lambda *a, **k: Dying()
'''


def test_a_check_lost_with_its_worker_leaves_its_siblings_verdicts_standing(tmp_path):
    """A worker dies under one check of a program: that check is an error naming the worker, in
    its result and in every report; the program's other checks keep the verdicts they reached
    (not the lost one's error); the run does not pass, and the next run runs the lost one alone."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    with open(z / "dodo.py", "a") as f:
        f.write(DYING)
    rc, ran, out = doit(z)
    assert rc not in (0, 3) and "Traceback" not in out, out
    rows = _report(z)
    assert rows[("b", "float64")]["verdict"] == "error" and "died" in rows[("b", "float64")]["reason"]
    assert rows[("b", "float32")]["verdict"] == "pass" and rows[("b", "float32")]["reason"] is None
    assert json.loads((z / "build/results/b/float32.json").read_text())["verdict"] == "pass"
    junit = (z / "build/junit.xml").read_text()
    assert junit.count("<error") + junit.count("<failure") == 1, junit
    assert "2 checks: 1 pass, 1 error (b float64)" in out, out
    kept = (z / "build/results/b/float32.json").read_bytes()
    rc, ran, out = doit(z)   # the lost check runs again (its worker dies again), the pass is kept
    assert "lock:b" in ran and "[float64] ERROR" in out, out
    assert (z / "build/results/b/float32.json").read_bytes() == kept


def test_the_history_of_a_token_output_holds_its_logits_figures(tmp_path):
    """A decode step's output is a token (0 error whenever it agrees): the history and `logos
    results` show the figures of the stage that feeds it, as summary.md does."""
    from emitter.pipeline import results
    db = str(tmp_path / "h.sqlite")
    token = {"max_abs": 0.0, "integer": True, "feeding": {"stage": 665, "out": "logits", "max_abs": 6.4e-05,
                                                          "max_rel": 3.3e-06, "nmse": 2.5e-13, "cosine": 1.0}}
    tensor = {"max_abs": 2.5e-07, "integer": False}
    results.record_all(db, [{"name": "lm", "dtype": "float32", "verdict": "pass", "output": token},
                            {"name": "mlp", "dtype": "float32", "verdict": "pass", "output": tensor}])
    got = {r["name"]: r["max_abs"] for r in results.latest(db)}
    assert got == {"lm": 6.4e-05, "mlp": 2.5e-07}


def test_compile_py_test_names_weights_other_than_golden_was_made_from(tmp_path):
    """golden/ records the sha256 of the weights it was made from: `compile.py test` on edited
    weights says so, naming the file, before its verdict (a fail then reads as what it is); on the
    weights as locked it says nothing of the kind."""
    import sys
    from test_pipeline import _weights
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    record = json.loads((z / "build/bundles/a/golden/golden.json").read_text())
    import hashlib
    assert record["weights_sha256"] == {"w.f64": hashlib.sha256((z / "weights/a/w.f64").read_bytes()).hexdigest()}

    def test():
        return subprocess.run([sys.executable, "build/bundles/a/compile.py", "test"], cwd=z,
                              capture_output=True, text=True)
    p = test()
    assert p.returncode == 0 and "note:" not in p.stderr, p.stdout + p.stderr
    _weights(str(z / "weights/a/w.f64"), 1)
    p = test()
    assert p.returncode == 1 and "FAIL" in p.stdout, p.stdout + p.stderr
    assert "note: golden/ was made from other weights than" in p.stderr and "w.f64 (edited since)" in p.stderr
    # a lock by hand records them too (README's workflow)
    done = logos("lock", "build/bundles/a", "--program", "programs/a.logos", "--weights", "weights/a",
                 "--dtype", "float32", "-o", str(tmp_path / "lock.json"), cwd=str(z))
    assert done.returncode == 0, done.stderr
    assert test().returncode == 0
    _weights(str(z / "weights/a/w.f64"), 2)
    p = test()
    assert p.returncode == 1 and "w.f64 (edited since)" in p.stderr, p.stdout + p.stderr


def test_compile_py_test_runs_model_py_as_it_is_not_a_cached_copy(tmp_path):
    """An edit of model.py that keeps its size and mtime (a sign flipped, the time put back) after
    `compile.py test` ran once (Python then keeps a __pycache__ copy it trusts by those two): the
    test runs the edited bytes and fails."""
    import re
    import sys
    from test_pipeline import _weights
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def test():
        return subprocess.run([sys.executable, "build/bundles/a/compile.py", "test"], cwd=z,
                              capture_output=True, text=True, env=env)
    p = test()
    assert p.returncode == 0, p.stdout + p.stderr
    (tmp_path / "ln").mkdir()   # run through a link to it: model.py is the one beside what it links to
    os.symlink(z / "build/bundles/a/compile.py", tmp_path / "ln" / "compile.py")
    p = subprocess.run([sys.executable, str(tmp_path / "ln" / "compile.py"), "test"], cwd=z, capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    model = z / "build/bundles/a/model.py"
    st, text = model.stat(), model.read_text()
    edited = re.sub(r"self\.tap\(0, (\w+) @ ", r"self.tap(0, \1 @-", text, count=1)
    assert edited != text and len(edited) == len(text)
    model.write_text(edited)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    p = test()
    assert p.returncode == 1 and "FAIL" in p.stdout, p.stdout + p.stderr


GEN = "import numpy as np, os, sys\nos.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)\n" \
      "np.random.default_rng(int(sys.argv[1])).standard_normal((4, 4)).tofile(sys.argv[2])\n"


@pytest.mark.parametrize("spelt", ["absolute", "folder", "linked"])
def test_a_dodo_task_writing_weights_is_waited_for_however_its_target_is_spelt(tmp_path, spelt):
    """The user's task writes a's weights, its target spelt as an absolute path, as the folder, or
    through a linked folder: the lock waits for it every run, and the report is about what it wrote
    (a changed seed: the lock runs again on the new file, the report current)."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None)})
    (z / "gen.py").write_text(GEN)
    out_file = "weights/a/w.f64"
    if spelt == "linked":
        (z / "data" / "a").mkdir(parents=True)
        (z / "weights").mkdir()
        os.symlink("../data/a", z / "weights" / "a")
        out_file = "data/a/w.f64"
    target = {"absolute": f"os.path.join(HERE, {out_file!r})", "folder": "'weights/a'",
              "linked": repr(out_file)}[spelt]
    with open(z / "dodo.py", "a") as f:
        f.write(f"\n\nimport os\nHERE = os.path.dirname(os.path.abspath(__file__))\n\n\ndef task_gen():\n"
                f"    seed = open('seed').read().strip()\n"
                f"    return {{'actions': ['{os.sys.executable} gen.py ' + seed + ' {out_file}'],\n"
                f"            'file_dep': ['gen.py', 'seed'], 'targets': [{target}]}}\n")
    for seed in ("0", "1"):
        (z / "seed").write_text(seed)
        rc, ran, out = doit(z)
        lines = [x[3:] for x in out.splitlines() if x.startswith(".  ")]
        assert rc == 0 and lines.index("gen") < lines.index("lock:a"), out
        r = json.loads((z / "build/results/a/float64.json").read_text())
        import hashlib
        assert r["inputs"]["weights"]["files"] == {
            "w.f64": hashlib.sha256((z / "weights/a/w.f64").read_bytes()).hexdigest()}
        done = logos("results", "--json", cwd=str(z))
        assert done.returncode == 0 and all(x["current"] for x in json.loads(done.stdout)["runs"]), done.stdout


def _with_fake_importer(z):
    """The zoo `z` with the test importer `fake` (a checkpoint is w's raw float64) and gen.py."""
    from test_pipeline import FAKE_IMPORTER
    (z / "emitter/importers/fake.py").write_text(FAKE_IMPORTER)
    with open(z / "emitter/importers/__init__.py", "a") as f:
        f.write('\nIMPORTERS["fake"] = ("emitter.importers.fake", "test importer")\n')
    (z / "gen.py").write_text(GEN)


def test_a_config_named_weights_folder_or_checkpoint_a_dodo_task_makes_is_waited_for(tmp_path):
    """`weights:` and `derive: checkpoint:` name paths a task of the user's dodo makes: no config
    error on the first run; the import and the lock wait for it."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, "weights: weights/custom\n"),
                                    "d": (PROG_A, "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n")})
    _with_fake_importer(z)
    with open(z / "dodo.py", "a") as f:
        f.write(f"\n\ndef task_gen():\n    for n, out in (('w', 'weights/custom/w.f64'), ('ck', 'ckpt/w.bin')):\n"
                f"        yield {{'name': n, 'actions': ['{os.sys.executable} gen.py 3 ' + out],\n"
                f"               'file_dep': ['gen.py'], 'targets': [out]}}\n")
    rc, ran, out = doit(z)
    lines = [x[3:] for x in out.splitlines() if x.startswith(".  ")]
    assert rc == 0, out
    assert lines.index("gen:w") < lines.index("lock:a") and lines.index("gen:ck") < lines.index("weights:d"), out
    rows = _report(z)
    assert all(rows[(n, dt)]["verdict"] == "pass" for n in ("a", "d") for dt in ("float64", "float32"))


def test_a_comment_edit_never_imports_where_a_dodo_task_writes_the_checkpoint(tmp_path):
    """With a task of the user's writing the derived program's checkpoint, a comment edit of the
    program re-emits and relocks, and never imports (the import key holds its sentences alone)."""
    z = make_zoo(tmp_path / "zoo", {"d": (PROG_A, "derive:\n  importer: fake\n  checkpoint: ckpt/w.bin\n")})
    _with_fake_importer(z)
    with open(z / "dodo.py", "a") as f:
        f.write(f"\n\ndef task_gen():\n    return {{'actions': ['{os.sys.executable} gen.py 3 ckpt/w.bin'],\n"
                f"            'file_dep': ['gen.py'], 'targets': ['ckpt/w.bin']}}\n")
    assert doit(z)[0] == 0
    with open(z / "programs/d.logos", "a") as f:
        f.write("# a comment\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "emit:d" in ran and "weights:d" not in ran, out


def test_a_programs_folder_that_cannot_be_listed_refuses_the_run_and_sweeps_nothing(tmp_path):
    """programs/ a link whose target is gone (an uninitialised submodule) or a loop: the run is
    refused naming it (exit 3), never a green run of no checks that sweeps every result away."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    os.rename(z / "programs", z / "sub")
    os.symlink("sub", z / "programs")
    assert doit(z)[0] == 0
    os.rename(z / "sub", z / "sub.away")
    rc, ran, out = doit(z)
    assert rc == 3 and "doit: refused: programs/ cannot be listed: No such file or directory (a link to sub)" in out, out
    assert (z / "build/results/b/float32.json").is_file() and (z / "build/bundles/b/model.py").is_file()
    os.unlink(z / "programs")
    os.symlink("programs", z / "programs")
    rc, ran, out = doit(z)
    assert rc == 3 and "Too many levels of symbolic links" in out, out


def test_a_defaults_yaml_link_that_leads_nowhere_or_out_is_refused(tmp_path):
    """programs/defaults.yaml linked to a file that is gone, or out of the repository: every
    program an error naming it, never the built-in defaults read in its place."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "shared").mkdir()
    (z / "shared/defaults.yaml").write_text("dtypes: [float64, float32, bfloat16]\n")
    os.symlink("../shared/defaults.yaml", z / "programs/defaults.yaml")
    assert doit(z)[0] == 0 and len(_report(z)) == 3
    os.rename(z / "shared", z / "gone")
    rc, ran, out = doit(z)
    assert rc == 1 and all("programs/defaults.yaml: cannot read the config: No such file or directory"
                           in r["reason"] for r in _report(z).values()), out
    outside = tmp_path / "outside.yaml"
    outside.write_text("dtypes: [float64]\n")
    os.unlink(z / "programs/defaults.yaml")
    os.symlink(outside, z / "programs/defaults.yaml")
    rc, ran, out = doit(z)
    assert rc == 1 and all("is a link that" in r["reason"] for r in _report(z).values()), out


def test_logos_check_names_configs_no_program_reads(tmp_path):
    """`logos check` of a zoo (the pre-commit hook too) warns of a `.yml` config and an orphaned
    `.yaml` one, as doit does."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "programs/b.yml").write_text("dtypes: [float32]\n")
    (z / "programs/gone.yaml").write_text("dtypes: [float32]\n")
    for args in ((), ("programs/b.yml",)):
        done = logos("check", *args, cwd=str(z))
        assert done.returncode == 0, done.stderr
        assert "warning: programs/b.yml: not read (a config is NAME.yaml" in done.stderr
    assert "programs/gone.yaml: a config with no program beside it" in logos("check", cwd=str(z)).stderr


@pytest.mark.parametrize("creator", [
    # a generator mixing named subtasks and a task of another basename
    "def task_gen():\n    yield {'name': 'wa', 'actions': [GEN_W], 'targets': ['weights/a/w.f64']}\n"
    "    yield {'basename': 'docs', 'actions': ['echo hi > notes.txt'], 'targets': ['notes.txt']}\n",
    # a creator that returns the same dict each call (doit turns its basename into its name)
    "GEN = {'actions': [GEN_W], 'targets': ['weights/a/w.f64']}\n\n\ndef task_gen():\n    return GEN\n",
    # a creator with parameters, and one doit delays: read only by name, their tasks still run
    "from doit import task_params\n\n\n@task_params([{'name': 'seed', 'default': 0, 'long': 'seed'}])\n"
    "def task_gen(seed):\n    return {'actions': [GEN_W], 'targets': ['weights/a/w.f64']}\n\n\n"
    "def task_plain():\n    return {'actions': ['echo p > plain.txt'], 'targets': ['plain.txt']}\n",
])
def test_the_dodos_own_tasks_run_by_doits_names_before_the_locks_that_read_them(tmp_path, creator):
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None)})
    (z / "gen.py").write_text(GEN)
    with open(z / "dodo.py", "a") as f:
        f.write(f"\n\nGEN_W = '{os.sys.executable} gen.py 4 weights/a/w.f64'\n\n\n{creator}")
    for _ in range(2):
        rc, ran, out = doit(z)
        assert rc == 0 and "does not exist" not in out, out
    assert (z / "weights/a/w.f64").is_file()
    assert _report(z)[("a", "float64")]["verdict"] == "pass"
    if "plain" in creator:
        assert (z / "plain.txt").is_file()


def test_a_config_a_dodo_task_rewrites_during_the_run_is_not_reported_current(tmp_path):
    """The user's task rewrites a program's config after the run read it: that run's report says
    the checks are not current (red), never a green report about the old config; the next run
    locks them on the new one."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "cfgsrc").write_text("dtypes: [float64]\n")
    _copying_task(z, "cfg", "cfgsrc", "programs/b.yaml")
    doit(z)
    assert doit(z)[0] == 0
    (z / "cfgsrc").write_text("dtypes: [float64, float32]\n")
    rc, ran, out = doit(z)
    assert rc == 1, out
    rows = _report(z)
    assert all(not r["current"] and "programs/b.yaml: changed during this run" in r["reason"] for r in rows.values())
    rc, ran, out = doit(z)
    assert rc == 0 and set(_report(z)) == {("b", "float64"), ("b", "float32")}, out
    assert doit(z)[:2] == (0, set())


def test_a_program_a_dodo_task_makes_during_the_run_is_an_error_row_of_that_run(tmp_path):
    """The user's task writes a program that was not there when the run read the zoo: the report
    waits for that task and has an error row for the new program (none of its checks ran), so the
    run exits 1, never a green report that leaves it out; the next run locks it."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    (z / "template.txt").write_text(PROG_B)
    _copying_task(z, "gen", "template.txt", "programs/gen.logos")
    rc, ran, out = doit(z)
    assert rc == 1 and "gen" in ran, out
    rows = _report(z)
    assert rows[("gen", "emit")]["verdict"] == "error" and not rows[("gen", "emit")]["current"], rows
    assert "programs/gen.logos: made during this run" in rows[("gen", "emit")]["reason"], rows
    assert "gen" in (z / "build/summary.md").read_text()
    rc, ran, out = doit(z)
    assert rc == 0 and ("gen", "float64") in _report(z) and ("gen", "emit") not in _report(z), out
    assert all(r["verdict"] == "pass" and r["current"] for r in _report(z).values()), _report(z)
    assert doit(z)[:2] == (0, set())


@pytest.mark.parametrize("task", [
    # no target: doit may run it after the report
    "def task_zzmake():\n    def act():\n        import shutil; shutil.copy('programs/b.logos', 'programs/late.logos')\n"
    "    return {'actions': [act], 'uptodate': [False]}\n",
    # a creator doit calls late (its targets cannot be told early): the report waits for nothing
    "from doit import create_after\n\n\n@create_after()\ndef task_zzmake():\n    def act():\n"
    "        import shutil; shutil.copy('programs/b.logos', 'programs/late.logos')\n"
    "    return {'actions': [act], 'targets': ['programs/late.logos'], 'uptodate': [False]}\n",
    # a program rewritten after the report (a checkout, a generator), by a hidden task
    "def task__zzmake():\n    def act():\n        open('programs/b.logos', 'a').write('Let z2 be sigmoid of y.\\n')\n"
    "    return {'actions': [act], 'uptodate': [False]}\n",
    # a weights file written after the report
    "import pathlib\n\n\ndef task_zzmake():\n    def act():\n        p = pathlib.Path('weights/a/w.f64')\n"
    "        p.write_bytes(p.read_bytes()[8:] + p.read_bytes()[:8])\n"
    "    return {'actions': [act], 'task_dep': ['report'], 'uptodate': [False]}\n",
])
def test_a_program_moved_after_the_report_read_the_zoo_leaves_no_green_report(tmp_path, task):
    """A task of the dodo's own that runs after the report (doit's order, where it declares no
    target the report could wait for) makes or rewrites a program: at the run's end the report is
    written again as the zoo is then (its rows errors, not current) and the run exits 1, naming
    the file; it ended green."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    with open(z / "dodo.py", "a") as f:
        f.write("\n\n" + task)
    rc, ran, out = doit(z)
    assert rc == 1 and "changed after the report read the zoo" in out, out
    rows = _report(z)
    bad = [r for r in rows.values() if r["verdict"] != "pass"]
    assert bad and all(not r["current"] for r in bad), rows
    assert not (z / "build/summary.md").read_text().startswith("## ✅"), (z / "build/summary.md").read_text()[:200]


def test_a_program_touched_after_the_report_with_its_bytes_the_same_is_no_finding(tmp_path):
    """A task that runs after the report touches a program and its weights (an editor's save of
    the same bytes, a chmod): the report, judged again as the zoo is then, still passes, and the
    run exits 0, saying nothing."""
    z = make_zoo(tmp_path / "zoo", {"a": (PROG_A, None), "b": (PROG_B, None)})
    _weights(str(z / "weights/a/w.f64"), 0)
    assert doit(z)[0] == 0
    with open(z / "dodo.py", "a") as f:
        f.write("\n\nimport os\n\n\ndef task_zztouch():\n    def act():\n"
                "        os.utime('programs/b.logos')\n        os.chmod('weights/a/w.f64', 0o640)\n"
                "    return {'actions': [act], 'task_dep': ['report'], 'uptodate': [False]}\n")
    rc, ran, out = doit(z)
    assert rc == 0 and "zztouch" in ran and "changed after the report" not in out, out
    assert all(r["verdict"] == "pass" and r["current"] for r in _report(z).values())


def test_a_defaults_file_a_dodo_task_makes_during_the_run_is_not_reported_current(tmp_path):
    """A config that was not there when the run read the zoo (the zoo's defaults, made by the
    user's task) changes every program's checks: the zoo's tasks wait for that task, and the
    run's report says its checks are not current; the next run locks on it."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None), "c": (PROG_B, "dtypes: [float64]\n")})
    assert doit(z)[0] == 0
    (z / "src.yaml").write_text("steps: 2\n")
    _copying_task(z, "defaults", "src.yaml", "programs/defaults.yaml")
    rc, ran, out = doit(z)
    assert rc == 1 and "defaults" in ran, out
    rows = _report(z)
    assert rows and all(not r["current"] and "programs/defaults.yaml: changed during this run" in r["reason"]
                        for r in rows.values()), rows
    rc, ran, out = doit(z)
    assert rc == 0 and all(r["current"] and r["verdict"] == "pass" for r in _report(z).values()), out
    assert json.loads((z / "build/results/b/float64.json").read_text())["steps"] == 2
    assert doit(z)[:2] == (0, set())


def test_a_dodo_whose_tasks_doit_orders_by_files_locks_programs_with_no_config_or_weights(tmp_path):
    """A creator that cannot be called early (doit's create_after) makes doit order the zoo's
    tasks by their files: a config or weights folder a program could have and has not is no
    file it depends on (doit refuses a dependency that is not there)."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    with open(z / "dodo.py", "a") as f:
        f.write("\n\nfrom doit import create_after\n\n\n@create_after(executed='report')\n"
                "def task_late():\n    return {'actions': ['echo late'], 'verbosity': 2}\n")
    rc, ran, out = doit(z)
    assert rc == 0 and {"emit:b", "lock:b", "late"} <= ran, out
    assert {r["verdict"] for r in _report(z).values()} == {"pass"}


def test_what_configures_a_check_made_or_removed_after_the_run_read_it_is_found():
    """changed_since, the report's look at what the run read the zoo from: a program's config
    made or removed, the zoo's defaults made, a default weights folder made where there was none
    (each after the run began); nothing for files as they were."""
    import tempfile
    import time
    from emitter.pipeline.checks import entries
    from emitter.pipeline.config import discover
    from emitter.pipeline.report_aside import changed_since
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as d:
        try:
            os.chdir(d)
            os.makedirs("programs")
            for n in ("a", "b", "c"):
                open(f"programs/{n}.logos", "w").write(PROG_B)
            open("programs/b.yaml", "w").write("steps: 1\n")
            zoo = entries(discover("."))
            time.sleep(0.01)
            began = os.stat("programs/b.yaml").st_ctime_ns + 1
            assert changed_since(zoo, began) == {}
            os.makedirs("weights/c")
            assert changed_since(zoo, began) == {"c": "weights/c"}
            os.unlink("programs/b.yaml")
            open("programs/a.yaml", "w").write("steps: 2\n")
            assert changed_since(zoo, began) == {"a": "programs/a.yaml", "b": "programs/b.yaml", "c": "weights/c"}
            open("programs/defaults.yaml", "w").write("steps: 2\n")
            assert changed_since(zoo, began) == {"a": "programs/defaults.yaml", "b": "programs/b.yaml",
                                                 "c": "programs/defaults.yaml"}
        finally:
            os.chdir(here)


def test_a_thread_count_torch_cannot_take_is_refused_before_anything_runs(tmp_path):
    """threads=99999 crashed the process after its PASS line (torch's pool): refused, exit 3."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    rc, ran, out = doit(z, "threads=99999")
    assert rc == 3 and "threads=99999: must be a whole number from 1 to 4096" in out and not ran, out
    assert doit(z, "threads=2")[0] == 0


def test_results_judge_currency_at_the_thread_count_a_run_would_use(tmp_path):
    """The thread count is in every check's key: after `doit threads=2`, a plain `doit` locks
    again, so `logos results` (a plain run's threads=1) says not current; `--threads 2` says
    current, as `doit threads=2` would find it."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    assert doit(z, "threads=2")[0] == 0

    def stated(n):   # every view of the report says which thread count its currency is about
        build = z / "build"
        assert json.loads((build / "report.json").read_text())["threads"] == n
        said = (build / "summary.md").read_text().splitlines()[2]   # (and when it was judged)
        assert f"Each pass or fail is current against its check's key at threads={n}, 20" in said, said   # (no commit: no git)
        assert "(`logos results` says whether it still is)" in said
        assert f'<property name="threads" value="{n}" />' in (build / "junit.xml").read_text()
        assert f"currency judged at threads={n}" in (build / "report.html").read_text()
    stated(2)
    p = logos("results", cwd=z)
    assert p.returncode == 1 and "2 not current" in p.stdout and "at threads=1" in p.stdout, p.stdout
    p = logos("results", "--threads", "2", "--json", cwd=z)
    assert p.returncode == 0 and json.loads(p.stdout)["not_current"] == 0, p.stdout
    assert doit(z, "threads=2")[:2] == (0, set())      # doit agrees: nothing to do at 2
    rc, ran, out = doit(z)
    assert rc == 0 and "lock:b" in ran, out            # and a plain run locks again, at 1
    stated(1)
    assert logos("results", cwd=z).returncode == 0
    p = logos("results", "--threads", "0", cwd=z)
    assert p.returncode == 2 and "must be a whole number from 1 to 4096" in p.stderr, p.stderr


def test_the_report_states_the_thread_count_of_its_run_where_no_check_is_locked(tmp_path):
    """The thread count the report states is in the report's key: with no locked check, a run at
    another threads= writes the report again, saying so."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, "lock: false\n")})
    assert doit(z)[0] == 0
    assert json.loads((z / "build/report.json").read_text())["threads"] == 1
    rc, ran, out = doit(z, "threads=2")
    assert rc == 0 and ran == {"report"}, out
    assert json.loads((z / "build/report.json").read_text())["threads"] == 2


def test_a_mistyped_variable_is_named_with_the_one_it_is_near(tmp_path):
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    rc, ran, out = doit(z, "worker=4", "exectuor=inline", "mine=1")
    assert rc == 0, out
    assert "warning: `worker=` is no variable of the zoo's; did you mean `workers`? It is ignored" in out
    assert "did you mean `executor`?" in out and "`mine=`" not in out
    assert "workers=" not in out.replace("`worker=`", "")
    rc, ran, out = doit(z, "workers=3")    # a variable of the zoo's that this executor never reads
    assert rc == 0 and "warning: workers=3 is read by executor=dask:local only; executor=inline ignores it" in out, out


def test_a_mistyped_task_is_named_with_the_one_it_is_near(tmp_path):
    # doit's own refusal names no task; a dodo's own task and a pattern pass unremarked
    z = make_zoo(tmp_path / "zoo", {"mlp": (PROG_B, None)})
    for typed, near in (("lock:mlpp", "lock:mlp"), ("lokc:mlp", "lock:mlp"), ("reprot", "report")):
        rc, ran, out = doit(z, typed)
        assert rc == 3 and not ran, out
        assert f"warning: `{typed}` is no task of the zoo's; did you mean `{near}`?" in out, out
    rc, ran, out = doit(z, "lock:*")
    assert rc == 0 and "no task of the zoo's" not in out, out


def test_lock_code_that_cannot_be_imported_is_an_error_per_check_never_a_crash(monkeypatch):
    """The inline executor imports the lock code before any limit runs; an import that fails is
    each check's error (recorded as such), not an exception out of the lock task."""
    from emitter.pipeline import check_worker, executors

    def broken():
        raise ModuleNotFoundError("No module named 'torch'")
    monkeypatch.setattr(check_worker, "loaded_code", broken)
    jobs = [{"record": {"dtype": d}} for d in ("float64", "float32")]
    assert executors.Inline().run(jobs, 10) == \
        [{"error": "the lock check raised ModuleNotFoundError: No module named 'torch'"}] * 2


@pytest.mark.parametrize("programs", ["none", "empty"])
def test_a_zoo_with_no_programs_fails_its_run_and_says_so(tmp_path, programs):
    # a programs/ moved away, or a dodo placed where there is none, must not read as a green run
    z = make_zoo(tmp_path / "zoo", {})
    if programs == "none":
        (z / "programs").rmdir()
    rc, ran, out = doit(z)
    assert rc == 1 and "report" in ran, out
    assert f"no programs: {z / 'programs'}/ holds no NAME.logos: nothing was checked" in out
    assert (z / "build/summary.md").read_text().startswith("## ❌ LOGOS lock: 0 programs, 0 checks")
    assert json.loads((z / "build/report.json").read_text())["results"] == []


@pytest.mark.parametrize("jobs", [(), ("-n", "2")])
def test_a_bundle_that_ends_its_process_costs_its_own_check_alone(tmp_path, jobs):
    # an op spelt (in this zoo's copy of the emitter) to end the process it runs in, as a native
    # crash does: its checks are errors saying so, every other program is locked, the report made
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None), "c": (PROG_B, None),
                                    "g": (PROG_B.replace("rmsnorm of x", "exact gelu of x"), None)})
    ops = z / "emitter/ops/activations.py"
    ops.write_text(ops.read_text().replace('return f"F.gelu({a.name(\'X\')})"',
                                           'return f"(__import__(\'os\')._exit(7) or F.gelu({a.name(\'X\')}))"'))
    rc, ran, out = doit(z, *jobs)
    assert rc == 1 and {"lock:b", "lock:c", "lock:g", "report"} <= ran, out
    rows = _report(z)
    assert {k: r["verdict"] for k, r in rows.items()} == {
        ("b", "float64"): "pass", ("b", "float32"): "pass", ("c", "float64"): "pass",
        ("c", "float32"): "pass", ("g", "float64"): "error", ("g", "float32"): "error"}, out
    for dt in ("float64", "float32"):
        assert rows["g", dt]["reason"] == \
            f"the {dt} lock check's process ended with exit status 7 before the check ended", out


def test_a_check_stalled_where_no_signal_reaches_is_killed_and_the_others_run(monkeypatch):
    # a native call past limits.seconds: its own limit cannot end it, its child is killed
    import signal
    import time
    from emitter.pipeline import executors, isolated

    def fake(job):
        if job["k"] == "exit":
            os._exit(3)
        if job["k"] == "stall":   # (SIGALRM held off, as a call in C holds off Python's handler)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(120)
        return {"result": {"k": job["k"], "pid": os.getpid()}}
    monkeypatch.setattr(executors, "run_check", fake)
    monkeypatch.setattr(isolated, "GRACE", 1)
    jobs = [{"k": k, "record": {"dtype": dt}} for k, dt in
            (("ok", "float64"), ("stall", "float32"), ("ok", "bfloat16"), ("exit", "float16"), ("ok", "x"))]
    start = time.monotonic()
    out = executors.Inline().run(jobs, 1)
    assert time.monotonic() - start < 60
    assert [o.get("error") or o["result"]["k"] for o in out] == [
        "ok", "the float32 lock check took over 1 s (limits.seconds) in a call no signal stops: its process "
        "was killed 1 s later", "ok", "the float16 lock check's process ended with exit status 3 before "
        "the check ended", "ok"]
    pids = [o["result"]["pid"] for o in out if "result" in o]
    assert os.getpid() not in pids and len(set(pids)) == 3   # (a new child after each loss)


def test_the_inline_child_serves_every_check_and_hands_back_outcomes_and_findings_whole(monkeypatch):
    # one child for the process's checks (what they warm stays warm); a large outcome comes back
    # whole; what a check remembered of its leaves and hashed comes back into this process's record
    from emitter import fingerprint
    from emitter.pipeline import executors

    def fake(job):
        fingerprint.remember(f"test:{job['k']}", float(job["k"]))
        return {"result": {"pid": os.getpid(), "golden": np.arange(job["k"] * (1 << 20), dtype=np.float64)}}
    monkeypatch.setattr(executors, "run_check", fake)
    merged = []
    monkeypatch.setattr(fingerprint, "merge", merged.append)
    ex = executors.Inline()
    out = ex.run([{"k": k, "record": {"dtype": "float32"}} for k in (1, 8)], 60)
    ex.close()
    assert len({o["result"]["pid"] for o in out}) == 1 and out[0]["result"]["pid"] != os.getpid()
    assert [o["result"]["golden"].size for o in out] == [1 << 20, 8 << 20]
    assert np.array_equal(out[1]["result"]["golden"], np.arange(8 << 20, dtype=np.float64))
    assert [found for _, found in merged] == [{"test:1": 1.0}, {"test:8": 8.0}]


def test_what_a_check_prints_in_the_inline_child_reaches_the_task_that_sent_it(monkeypatch, capsys):
    # the child's own streams are those of the task it was forked in (doit's capture of it): what
    # a later check says goes to the task running then, after doit's lines; what escapes a check
    # (a KeyboardInterrupt it raised) is its error, named
    import sys
    from emitter.pipeline import executors, log

    def fake(job):
        if job["k"] == "interrupt":
            raise KeyboardInterrupt("from the bundle")
        print(f"said {job['k']}")
        print(f"warned {job['k']}", file=sys.stderr)
        log.LOG.warning(f"logged {job['k']}")
        return {"result": {"k": job["k"]}}
    monkeypatch.setattr(executors, "run_check", fake)
    monkeypatch.setattr(log.LOG, "handlers", [])   # (its handler on this test's stderr)
    log.setup(1)
    ex = executors.Inline()
    print("before")
    out = ex.run([{"k": k, "record": {"dtype": "float32"}} for k in ("one", "interrupt", "two")], 60)
    ex.close()
    assert out[1] == {"error": "the lock check raised KeyboardInterrupt: from the bundle"}
    got = capsys.readouterr()
    assert got.out == "before\nsaid one\nsaid two\n"
    assert got.err == "warned one\nlogged one\nwarned two\nlogged two\n"
