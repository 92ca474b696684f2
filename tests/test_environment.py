"""The environment fingerprint holds the settings that change a lock's figures beyond the versions
and the CPU: torch's kernel choice (ATEN_CPU_CAPABILITY), its BLAS's and OpenMP's settings, numpy's
SIMD dispatch; a change of one moves the digest, so every lock reruns."""

import json
import os
import subprocess
import sys

import pytest

from emitter.pipeline.check_worker import POOL_VARS
from emitter.verify import environment
from conftest import ROOT
from test_pipeline import PROG_B, make_zoo

# every variable the fingerprint reads, unset for a test that sets its own
WATCHED = environment.THREAD_VARS + environment.NUMERICS_VARS + environment.LOADER_VARS


def _clean(monkeypatch):
    for k in WATCHED:
        monkeypatch.delenv(k, raising=False)


def test_the_cpu_capability_moves_the_digest(monkeypatch):
    _clean(monkeypatch)
    digests = {}
    for value in (None, "default", "avx2", "avx512"):
        if value is not None:
            monkeypatch.setenv("ATEN_CPU_CAPABILITY", value)
        digests[value] = environment.digest(environment.fingerprint())
    assert len(set(digests.values())) == 4, digests
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")      # the same setting, the same digest
    assert environment.digest(environment.fingerprint()) == digests["default"]
    assert environment.fingerprint()["numerics_env"] == {"ATEN_CPU_CAPABILITY": "default"}


def test_the_cpus_maker_and_model_move_the_digest(monkeypatch, tmp_path):
    """Two CPUs of one level and the same features (an AMD Zen 3 and an Intel Skylake client both
    show avx2, fma and f16c) take other kernels in MKL and OpenBLAS: their maker and model are in
    the fingerprint. Arm lists its part after its features; only the first processor counts."""
    from emitter.verify import cpu
    _clean(monkeypatch)
    flags = "flags\t\t: fpu sse4_2 avx avx2 fma f16c\n"
    files = {"intel": "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 94\n" + flags,
             "amd": "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 33\n" + flags
                    + "\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n" + flags,
             "arm": "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n\n"
                    "processor\t: 1\nFeatures\t: fp asimd\nCPU implementer\t: 0x51\nCPU part\t: 0x001\n"}
    seen, digests = {}, {}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(cpu, "CPUINFO", str(tmp_path / name))
        environment._installed.cache_clear()   # (a process reads its CPU once)
        seen[name] = cpu.describe()
        digests[name] = environment.digest(environment.fingerprint())
    assert seen["intel"]["isa"] == seen["amd"]["isa"] == "avx2" and seen["intel"]["cpu_features"] == \
        seen["amd"]["cpu_features"] == ["fma", "f16c"]
    assert seen["amd"]["cpu_model"] == "vendor_id=AuthenticAMD cpu family=25 model=33", seen
    assert seen["arm"] == {"isa": "asimd", "cpu_features": ["bf16", "i8mm"],
                           "cpu_model": "CPU implementer=0x41 CPU part=0xd40"}, seen
    environment._installed.cache_clear()
    assert len(set(digests.values())) == 3, digests


@pytest.mark.parametrize("var, value", [("MKL_CBWR", "COMPATIBLE"), ("MKL_ENABLE_INSTRUCTIONS", "AVX2"),
                                        ("MKL_DYNAMIC", "FALSE"), ("OMP_DYNAMIC", "true"),
                                        ("ONEDNN_MAX_CPU_ISA", "AVX2"),
                                        ("NPY_DISABLE_CPU_FEATURES", "AVX512F"),
                                        ("OPENBLAS_BLOCK_FACTOR", "50"), ("GOTO_NUM_THREADS", "2"),
                                        ("LD_PRELOAD", "/opt/erf-shim.so"), ("LD_LIBRARY_PATH", "/opt/libm")])
def test_each_numerics_setting_moves_the_digest(monkeypatch, var, value):
    _clean(monkeypatch)
    before = environment.digest(environment.fingerprint())
    monkeypatch.setenv(var, value)
    assert environment.digest(environment.fingerprint()) != before


def test_kernel_choices_are_not_pool_sizes():
    """Each watched variable is named once; only thread-count variables size Dask workers' pools
    (what check_worker copies from the driver), never a kernel choice; torch reads no
    TORCH_NUM_THREADS, so it is not one."""
    assert len(set(WATCHED)) == len(WATCHED)
    assert set(POOL_VARS) <= set(environment.THREAD_VARS)
    assert all(v.endswith("_NUM_THREADS") for v in POOL_VARS)
    assert "ATEN_CPU_CAPABILITY" in environment.NUMERICS_VARS
    assert "ATEN_CPU_CAPABILITY" not in POOL_VARS and "MKL_CBWR" not in POOL_VARS
    # MKL's per-domain counts are not reset by the pools' explicit sizes: a worker keeps its own
    assert "MKL_DOMAIN_NUM_THREADS" not in POOL_VARS and "GOTO_NUM_THREADS" in POOL_VARS
    assert "TORCH_NUM_THREADS" not in WATCHED


def test_describe_records_the_capability_torch_uses(monkeypatch):
    import numpy as np
    import torch
    _clean(monkeypatch)
    d = environment.describe(np, torch)
    assert d["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert d["digest"] == environment.digest(environment.fingerprint())


def test_a_changed_cpu_capability_reruns_the_locks(tmp_path):
    """End to end: a zoo locked, then doit again with ATEN_CPU_CAPABILITY=default: the lock reruns
    under it (torch's kernels are another code path) and its result records it; then a no-op."""
    z = make_zoo(tmp_path / "zoo", {"b": (PROG_B, None)})
    base = {k: v for k, v in os.environ.items() if k not in WATCHED}

    def doit(**extra):
        p = subprocess.run([sys.executable, "-m", "doit"], cwd=z, capture_output=True, text=True,
                           env={**base, "LOGOS_PROGRESS": "names", **extra}, timeout=600)
        return p.returncode, {x[3:].strip() for x in p.stdout.splitlines() if x.startswith(".  ")}, \
            p.stdout + p.stderr

    rc, ran, out = doit()
    assert rc == 0 and "lock:b" in ran, out
    result = z / "build/results/b/float64.json"
    first = json.loads(result.read_text())["environment"]
    rc, ran, out = doit()
    assert (rc, ran) == (0, set()), out
    rc, ran, out = doit(ATEN_CPU_CAPABILITY="default")
    assert rc == 0 and "lock:b" in ran and "emit:b" not in ran, out     # the lock only
    env = json.loads(result.read_text())["environment"]
    assert env["numerics_env"] == {"ATEN_CPU_CAPABILITY": "default"}
    assert env["torch_cpu_capability"] == "DEFAULT" and env["digest"] != first["digest"]
    rc, ran, out = doit(ATEN_CPU_CAPABILITY="default")
    assert (rc, ran) == (0, set()), out
    rc, ran, out = doit()                                      # back: the locks rerun again
    assert rc == 0 and "lock:b" in ran and "emit:b" not in ran, out
    assert json.loads(result.read_text())["environment"]["digest"] == first["digest"]
    assert first["numerics_env"] == {}


def test_a_numpy_or_torch_shadowed_in_the_zoo_moves_the_environment(tmp_path):
    """`python -m doit` puts the zoo's folder first on sys.path: a numpy.py, a threadpoolctl.py or a torch/ there is
    what the checks import, whatever the installed versions say. The environment says so (and
    its digest, in every key, moves); the installed ones are "installed"."""
    code = ("import json, sys; sys.path.insert(0, ''); sys.path.insert(1, %r)\n"
            "from emitter.verify import environment as e\n"
            "fp = e.fingerprint(); print(json.dumps([fp['imports'], e.digest(fp)]))" % ROOT)

    def env_in(folder):
        p = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, check=True)
        return json.loads(p.stdout)
    clean = env_in(tmp_path)
    assert clean[0] == {"numpy": "installed", "torch": "installed", "math": "stdlib", "threadpoolctl": "installed"}
    for name in ("numpy", "threadpoolctl"):   # (threadpoolctl: without it the BLAS's thread count is not set)
        (tmp_path / f"{name}.py").write_text("raise ImportError('a shadow')\n")
        shadowed = env_in(tmp_path)
        assert shadowed[0][name].startswith("shadowed: ") and shadowed[1] != clean[1]
        os.unlink(tmp_path / f"{name}.py")
    (tmp_path / "math.py").write_text("from cmath import *\n")   # the VM's erf, exp, sin
    shadowed = env_in(tmp_path)
    assert shadowed[0]["math"].startswith("shadowed: ") and shadowed[1] != clean[1]
    os.unlink(tmp_path / "math.py")
    (tmp_path / "numpy").mkdir()   # what the import passes over is no shadow: a folder without
    (tmp_path / "torch").write_text("")   # __init__.py, a file named like the module, another ABI's
    (tmp_path / "numpy.cpython-39-x86_64-linux-gnu.so").write_bytes(b"")
    assert env_in(tmp_path) == clean
    os.unlink(tmp_path / "torch")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    assert env_in(tmp_path)[0]["torch"].startswith("shadowed: ")



def test_an_empty_loader_setting_is_unset_and_start_up_code_moves_the_digest(tmp_path, monkeypatch):
    """LD_PRELOAD="" preloads nothing: the digest of no setting. A sitecustomize that Python ran
    at start-up (here one that scales math.erf, which the VM's exact gelu computes with) moves
    the digest; one on disk that never ran does not."""
    _clean(monkeypatch)
    before = environment.digest(environment.fingerprint())
    monkeypatch.setenv("LD_PRELOAD", "")
    assert environment.digest(environment.fingerprint()) == before
    code = ("import json, math, sys; sys.path.insert(0, %r)\n"
            "from emitter.verify import environment as e\n"
            "fp = e.fingerprint(); print(json.dumps([fp['startup'], e.digest(fp), math.erf(1.0)]))" % ROOT)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import math\n_erf = math.erf\nmath.erf = lambda x: _erf(x) * 1.01\n")

    def env_with(pythonpath):
        env = {k: v for k, v in os.environ.items() if k not in WATCHED and k != "PYTHONPATH"}
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                           check=True, env={**env, **({"PYTHONPATH": pythonpath} if pythonpath else {})})
        return json.loads(p.stdout)
    clean, unrun = env_with(None), env_with(None)
    assert clean[0]["sitecustomize"] is None and clean == unrun
    ran = env_with(str(shim))
    assert set(ran[0]["sitecustomize"]) == {"sitecustomize", "math"} and len(ran[0]["sitecustomize"]["sitecustomize"]) == 64
    assert ran[2] != clean[2] and ran[1] != clean[1]   # its erf is another erf, and the digest says so


def test_what_start_up_code_imports_and_the_libraries_the_loader_puts_first_are_read(tmp_path, monkeypatch):
    """A sitecustomize that imports a module scaling math.erf: an edit of that module alone (the
    sitecustomize unchanged) moves the digest. A library LD_PRELOAD or LD_LIBRARY_PATH names,
    rebuilt at the same path, moves it too; both are named without their folder (clones share
    them)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import erfpatch\n")
    (site / "erfpatch.py").write_text("import math\n_e = math.erf\nmath.erf = lambda x: _e(x)\n")
    def env_now():
        return _started_with(site, "[fp['startup'], e.digest(fp)]")
    before = env_now()
    assert set(before[0]["sitecustomize"]) == {"sitecustomize", "erfpatch", "math"}, before
    assert before[0]["sitecustomize"]["math"] == "stdlib" and str(tmp_path) not in json.dumps(before[0])
    (site / "erfpatch.py").write_text("import math\n_e = math.erf\nmath.erf = lambda x: _e(x) * 1.05\n")
    after = env_now()
    assert after[0]["sitecustomize"]["sitecustomize"] == before[0]["sitecustomize"]["sitecustomize"]
    assert after[1] != before[1]

    _clean(monkeypatch)
    lib = tmp_path / "lib" / "liberf.so"
    lib.parent.mkdir()
    for var, value in (("LD_PRELOAD", str(lib)), ("LD_LIBRARY_PATH", str(lib.parent))):
        monkeypatch.delenv("LD_PRELOAD", raising=False)
        monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
        lib.write_bytes(b"\x7fELF one build")
        monkeypatch.setenv(var, value)
        first = environment.digest(environment.fingerprint())
        assert list(environment.loader_libraries()) == ["0:liberf.so"]
        lib.write_bytes(b"\x7fELF another build")   # the same path, another library
        assert environment.digest(environment.fingerprint()) != first, var


def test_start_up_closure_reads_namespace_packages_stops_at_installed_ones_and_survives_bad_files(tmp_path):
    """What a sitecustomize imports: a namespace package (no __init__.py) is its files, an edit of
    one moves its hash; an installed distribution whose import name is not its own (yaml, of
    PyYAML) is named, never read; a module that cannot be read or parsed is no crash."""
    site = tmp_path / "site"
    (site / "nsp").mkdir(parents=True)
    (site / "sitecustomize.py").write_text("import nsp.inner, yaml\ntry:\n    import broken\nexcept Exception:\n"
                                           "    pass\ntry:\n    import unread\nexcept Exception:\n    pass\n")
    (site / "nsp" / "inner.py").write_text("x = 1\n")
    (site / "broken.py").write_text("def (:\n")
    (site / "unread").mkdir()   # (a folder where a module's file is looked for)
    def closure():
        return _started_with(site, "fp['startup']['sitecustomize']")
    before = closure()
    assert before["yaml"] == "installed" and len(before["nsp"]) == 64 and len(before["broken"]) == 64, before
    (site / "nsp" / "inner.py").write_text("x = 2\n")
    after = closure()
    assert after["nsp"] != before["nsp"] and after["sitecustomize"] == before["sitecustomize"]


def test_the_loader_libraries_of_a_big_folder_are_all_read(tmp_path, monkeypatch):
    """LD_LIBRARY_PATH naming a folder of many files: every shared object of it is read, however
    many other files sort before it."""
    _clean(monkeypatch)
    for i in range(600):
        (tmp_path / f"a{i:04d}.txt").write_text("")
    (tmp_path / "libm.so.6").write_bytes(b"\x7fELF")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    assert list(environment.loader_libraries()) == ["0:libm.so.6"]


def test_a_module_start_up_code_imports_by_a_literal_name_in_a_call_is_read(tmp_path):
    """importlib.import_module("erfpatch") and __import__("erfpatch") in a sitecustomize: the
    module is in the closure and an edit of it alone moves the digest, as with `import erfpatch`."""
    for n, line in enumerate(("import importlib\nimportlib.import_module('erfpatch')\n",
                              "from importlib import import_module\nimport_module('erfpatch')\n",
                              "__import__('erfpatch')\n")):
        site = tmp_path / f"site{n}"
        site.mkdir()
        (site / "sitecustomize.py").write_text(line)
        (site / "erfpatch.py").write_text("import math\n_e = math.erf\nmath.erf = lambda x: _e(x)\n")
        before = _started_with(site, "[fp['startup'], e.digest(fp)]")
        assert "erfpatch" in before[0]["sitecustomize"] and len(before[0]["sitecustomize"]["erfpatch"]) == 64, before
        (site / "erfpatch.py").write_text("import math\n_e = math.erf\nmath.erf = lambda x: _e(x) * 1.05\n")
        after = _started_with(site, "[fp['startup'], e.digest(fp)]")
        assert after[0]["sitecustomize"]["sitecustomize"] == before[0]["sitecustomize"]["sitecustomize"]
        assert after[1] != before[1], line


def _started_with(site, what):
    """`what` (an expression of `fp`, the fingerprint, and `e`, the module) as JSON, from a fresh
    interpreter started with `site` on PYTHONPATH (its sitecustomize runs) and no watched setting."""
    code = ("import json, sys; sys.path.insert(0, %r)\n"
            "from emitter.verify import environment as e\n"
            "fp = e.fingerprint(); print(json.dumps(%s))" % (ROOT, what))
    env = {k: v for k, v in os.environ.items() if k not in WATCHED}
    p = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True,
                       env={**env, "PYTHONPATH": str(site)})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_a_library_shadowed_on_the_path_is_named_by_every_file_of_it(tmp_path, monkeypatch):
    """A folder of a library's name found before the installed one (in the zoo, on PYTHONPATH) is
    `shadowed`, named by the sha256 of every code file of it, its other modules and extension
    modules too; an installed one is `installed`, whatever lies beside it."""
    from emitter.verify import environment
    assert environment.origins(("safetensors",)) == {"safetensors": "installed"}
    pkg = tmp_path / "safetensors"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from ._impl import *\n")
    (pkg / "_impl.py").write_text("SCALE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    first = environment.origins(("safetensors",))["safetensors"]
    assert first.startswith("shadowed: ")
    (pkg / "_impl.py").write_text("SCALE = 3\n")
    second = environment.origins(("safetensors",))["safetensors"]
    assert second.startswith("shadowed: ") and second != first
    (pkg / "_rust.abi3.so").write_bytes(b"\x7fELF")
    assert environment.origins(("safetensors",))["safetensors"] not in (first, second)
    (tmp_path / "safetensors-0.4.5.dist-info").mkdir()   # a distribution's name beside it: still read
    assert environment.origins(("safetensors",))["safetensors"].startswith("shadowed: ")


@pytest.mark.parametrize("v2", [False, True])
def test_a_containers_memory_cap_bounds_what_a_check_may_take(tmp_path, monkeypatch, v2):
    """A CI container's memory is its cgroup's limit, not its host's: the least of the machine's
    and the limits of the cgroup this process is in and those enclosing it (v1 or v2; `max` and
    v1's unlimited 2^63 are no limit)."""
    from emitter.verify import memory as e
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fs = tmp_path / "fs"
    root, name = (fs, "memory.max") if v2 else (fs / "memory", "memory.limit_in_bytes")
    (root / "ci" / "job").mkdir(parents=True)
    (root / name).write_text("max\n" if v2 else "9223372036854771712\n")
    (root / "ci" / name).write_text(f"{1536 << 20}\n")        # the enclosing group's cap
    (root / "ci" / "job" / name).write_text("max\n" if v2 else f"{4 << 30}\n")
    (tmp_path / "cgroup").write_text("0::/ci/job\n" if v2 else "12:pids:/ci\n9:cpuset,memory:/ci/job\n")
    monkeypatch.setattr(e, "CGROUPS", (str(tmp_path / "cgroup"), str(fs)))
    assert e.memory_bytes() == min(machine, 1536 << 20)
    (root / "ci" / name).write_text("max\n" if v2 else "9223372036854771712\n")
    assert e.memory_bytes() == (machine if v2 else min(machine, 4 << 30))
    monkeypatch.setattr(e, "CGROUPS", (str(tmp_path / "nothing"), str(fs)))
    assert e.memory_bytes() == machine


def test_another_build_of_one_version_is_another_environment(tmp_path, monkeypatch):
    """Two wheels of numpy 9.9 (a rebuild, another BLAS): their versions agree, their installers'
    RECORDs (every installed file's hash) do not, and the fingerprint takes the RECORD's sha256:
    of the folder the import finds numpy in, not of a stray dist-info earlier on sys.path (which
    is named beside it: the path moved). The environment this suite runs in has one for torch and
    numpy."""
    import hashlib
    from emitter.verify import environment as e
    assert all(e.fingerprint()["records"][n] for n in ("numpy", "torch")), e.fingerprint()["records"]
    real = e.records(("numpy",))
    stray = tmp_path / "stray"
    (stray / "numpy-9.9.dist-info").mkdir(parents=True)
    (stray / "numpy-9.9.dist-info" / "RECORD").write_text("")
    monkeypatch.setattr(sys, "path", [str(stray)] + sys.path)   # (no numpy there: named, not taken)
    assert e.records(("numpy",)) == {"numpy": [real["numpy"], ["numpy-9.9.dist-info"]]}
    assert e.versions(("numpy",))["numpy"] != "9.9"
    site = tmp_path / "site"
    (site / "numpy-9.9.dist-info").mkdir(parents=True)
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("")
    record = site / "numpy-9.9.dist-info" / "RECORD"
    record.write_text("numpy/__init__.py,sha256=AAAA,10\n")
    monkeypatch.setattr(sys, "path", [str(stray), str(site)] + sys.path)
    assert e.versions(("numpy",)) == {"numpy": "9.9"}
    assert e.records(("numpy",))["numpy"][0] == hashlib.sha256(record.read_bytes()).hexdigest()
    before = e.records(("numpy",))
    record.write_text("numpy/__init__.py,sha256=BBBB,10\n")   # (the same size)
    assert e.versions(("numpy",)) == {"numpy": "9.9"} and e.records(("numpy",)) != before
    assert e.records(("nothing_here",)) == {"nothing_here": None}
