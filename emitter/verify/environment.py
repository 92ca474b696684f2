"""What a verdict depends on beyond its inputs: the machine and the numeric stack.

`fingerprint()` is cheap and standard-library only (no numpy, no torch imported: the dodo computes
it on every run, so a torch or numpy upgrade, or a setting that changes the figures, reruns every
lock); `describe(np, torch)` adds what only the imported libraries can say (the BLAS, the thread
counts, torch's kernel level) for the lock's result."""

import functools
import importlib.machinery
import hashlib
import json
import os
import sys

from . import cpu

# Thread counts and the BLAS's core settings. Those ending in _NUM_THREADS only size thread pools
# (each check sets its pools explicitly): check_worker copies them from the driver to Dask workers.
# GOTO_NUM_THREADS and OPENBLAS_DEFAULT_NUM_THREADS are OpenBLAS's (numpy's) other spellings of its
# pool size, read when OPENBLAS_NUM_THREADS is unset.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
               "OPENBLAS_L2_SIZE", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "GOTO_NUM_THREADS", "OPENBLAS_DEFAULT_NUM_THREADS")
# Settings that choose another kernel or split the work otherwise, so change the figures: each is
# read by the stack installed here (found in torch's libtorch_cpu and libgomp, numpy's
# _multiarray_umath and its OpenBLAS). Not pool sizes: a worker keeps its own, and its verdict then
# carries another digest. (torch reads no TORCH_NUM_THREADS: only OMP_ and MKL_NUM_THREADS.)
NUMERICS_VARS = (
    "ATEN_CPU_CAPABILITY",          # torch's vectorised kernels (default, avx2, avx512...): another
                                    # code path for every elementwise op and reduction
    "TORCH_LINEAR_FLATTEN_3D",      # linear of a 3-d input as one addmm (the bias added in the gemm)
    "TORCH_MKLDNN_MATMUL_MIN_DIM",  # the sizes from which a reduced-precision matmul goes to oneDNN
    "TORCH_MKLDNN_MATMUL_MIN_SIZE", # instead of MKL or ATen's own kernel
    "MKL_CBWR",                     # MKL's conditional reproducibility: which code path it takes
    "MKL_ENABLE_INSTRUCTIONS",      # the instruction set MKL's kernels may use
    "MKL_DYNAMIC",                  # whether MKL may run on fewer threads than set
    "MKL_DOMAIN_NUM_THREADS",       # MKL's per-domain thread counts (BLAS, FFT, VML...)
    "MKL_NUM_STRIPES",              # how a threaded MKL gemm partitions its work
    # oneDNN (torch's mkldnn; it reads ONEDNN_X, else DNNL_X): the instruction set its kernels may
    # use, the vector length they prefer, and whether float32 may be computed in bf16 or tf32
    "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
    "ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS",
    "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
    "OMP_DYNAMIC",                  # whether OpenMP may run torch's and MKL's work on fewer threads
    "OMP_THREAD_LIMIT",             # a cap on OpenMP's threads, whatever the pools are set to
    "OPENBLAS_BLOCK_FACTOR",        # OpenBLAS's gemm blocks scaled: the sums in another order
    "NPY_DISABLE_CPU_FEATURES",     # numpy's SIMD loops (the VM's exp, tanh...: float64 AVX512
    "NPY_ENABLE_CPU_FEATURES",      # against the scalar libm)
    "GLIBC_TUNABLES",               # glibc's libm variant (glibc.cpu.hwcaps=-AVX2,-FMA moves the
                                    # bits of float64 sin, cos, exp, power the VM computes)
)
# The dynamic loader's settings: another library's code in place of libm's, OpenBLAS's or torch's
# own (an LD_PRELOAD shim of erf moves exact gelu's bits), whatever the versions say.
LOADER_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_HWCAP_MASK")
# the modules whose code computes a check's numbers, or sets how (threadpoolctl: the BLAS's thread
# count; missing or shadowed, the count is the environment's): where each is imported from
COMPUTING = ("numpy", "torch", "math", "threadpoolctl")
CODE_SUFFIXES = (".py",) + tuple(importlib.machinery.EXTENSION_SUFFIXES)
def _dist_infos(names):
    return _dist_infos_on(tuple(names), tuple(sys.path))


@functools.lru_cache(maxsize=8)
def _dist_infos_on(names, path):
    """({name: (its version, its dist-info folder)}, {name: [the others' folder names]}) of
    installed distributions: the dist-info of each name in the folder its import is found in,
    else the first on sys.path; and every other dist-info of that name on sys.path (a stray one
    in the zoo's folder names no library that runs, and still moves the environment: what the
    path holds is not what it was). importlib.metadata takes ~50 ms per lookup; this lists each
    folder once."""
    from importlib.machinery import PathFinder
    seen = {}
    for base in path:
        try:
            entries = sorted(os.listdir(base or "."))
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(".dist-info"):
                name, _, version = entry[:-len(".dist-info")].rpartition("-")
                key = name.lower().replace("-", "_")
                if key in names:
                    seen.setdefault(key, []).append((os.path.realpath(base or "."), version,
                                                     os.path.join(base or ".", entry)))
    found, others = {}, {}
    for n, there in seen.items():
        spec = PathFinder.find_spec(n, list(path))
        origin = getattr(spec, "origin", None) or ""
        home = os.path.realpath(os.path.dirname(os.path.dirname(origin)) if spec is not None and
                                spec.submodule_search_locations else os.path.dirname(origin))
        mine = next((t for t in there if t[0] == home), there[0])
        found[n] = mine[1:]
        if len(there) > 1:
            others[n] = [os.path.basename(p) for _, _, p in there if p != mine[2]]
    return found, others


def versions(names):
    """Installed distributions' versions, read from their dist-info folder names on sys.path."""
    found = _dist_infos(names)[0]
    return {n: found[n][0] if n in found else None for n in names}


def records(names):
    """{name: the sha256 of its installer's RECORD} of installed distributions: the hash of every
    file the wheel put there, so another build of one version (a rebuilt numpy, another torch
    wheel) is another environment; None where there is none. (A file edited in place after the
    install is not seen: reinstall the library.) Where other dist-infos of a name are on sys.path,
    its value is [that sha256, their folder names]."""
    from ..fingerprint import sha256_or_none
    found, others = _dist_infos(names)
    shas = {n: sha256_or_none(os.path.join(found[n][1], "RECORD")) if n in found else None for n in names}
    return {n: [sha, others[n]] if n in others else sha for n, sha in shas.items()}


def bundled_libraries(name):
    """The shared libraries a wheel of `name` carries beside it (`<name>.libs/`, as auditwheel lays
    them out: numpy's OpenBLAS, its build hash in the file name), from the first `name` on sys.path:
    the same numpy version against another BLAS is another environment. None when there are none
    (a source or conda build links the system's)."""
    for base in sys.path:
        if os.path.isfile(os.path.join(base or ".", name, "__init__.py")):   # the one import takes
            try:
                return sorted(os.listdir(os.path.join(base or ".", f"{name}.libs")))
            except OSError:
                return None
    return None


def origins(names):
    """{name: where `import name` finds it}: "installed" where it comes from a site folder that
    holds the metadata of a distribution of that name (a dist-info or egg-info: numpy's, torch's),
    "stdlib" or "builtin" for the interpreter's own (math), else what shadows it: "shadowed: "
    and the digest of every code file of it (a numpy.py or a safetensors/ in the zoo's folder,
    which `python -m doit` puts first on sys.path); None where it is nowhere. Found as the import finds
    it (sys.path's finders: a namespace folder or another ABI's extension module is passed over),
    nothing imported. The versions above are the distributions'; this says whether they are what
    runs."""
    from importlib.machinery import PathFinder
    stdlib, installed = os.path.dirname(os.__file__), _installed_folders()
    out = {}
    for name in names:
        if name in sys.builtin_module_names:
            out[name] = "builtin"
            continue
        spec = PathFinder.find_spec(name, sys.path)
        origin = getattr(spec, "origin", None)
        if spec is None or not origin or not os.path.isfile(origin):
            out[name] = None if spec is None else "shadowed"
            continue
        base = os.path.dirname(os.path.dirname(origin)) if spec.submodule_search_locations else os.path.dirname(origin)
        if base in (stdlib, os.path.join(stdlib, "lib-dynload")):
            out[name] = "stdlib"
            continue
        try:
            meta = any(e.lower().startswith(f"{name}-") and e.endswith((".dist-info", ".egg-info"))
                       for e in os.listdir(base))
        except OSError:
            meta = False
        if meta and os.path.realpath(base) in installed:
            out[name] = "installed"
        else:   # every file of it, its extension modules too: an edit of any is another library
            files = _package_files(os.path.dirname(origin)) if spec.submodule_search_locations else [origin]
            out[name] = "shadowed: " + _files_digest(files, base)
    return out


def _installed_folders():
    """The site folders (resolved) what is installed there comes from: named, never read."""
    return [os.path.realpath(d) for d in _site_folders()]


def _files_digest(files, base):
    """The sha256 of `files` by their names under `base` and their contents (the hash record's)."""
    from ..fingerprint import sha256_or_none
    return hashlib.sha256("\n".join(f"{os.path.relpath(f, base)}:{sha256_or_none(f)}" for f in files)
                          .encode()).hexdigest()


def startup():
    """The code Python runs at start-up beyond the standard library's, which may replace any
    function a check computes with: the sha256 of the sitecustomize and usercustomize that ran and
    of every module they import (`_closure`), and of the .pth files' import lines with the modules
    those import (an editable install's own finder aside: it maps this package, whose code every
    key holds). Named by module, never by path: two clones share it."""
    out, roots = {}, []
    for name in ("sitecustomize", "usercustomize"):   # (as the start-up imported them)
        module = sys.modules.get(name)
        out[name] = None if module is None else _closure([name], getattr(module, "__file__", None))
    lines = []
    for folder in _site_folders():
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".pth"))
        except OSError:
            continue
        for n in names:
            try:
                with open(os.path.join(folder, n), encoding="utf-8", errors="replace") as f:
                    text = f.read(1 << 20)
            except OSError:
                continue
            found = [ln.strip() for ln in text.splitlines()
                     if ln.startswith(("import ", "import\t")) and not n.startswith("__editable__")]
            lines += [f"{n}: {ln}" for ln in found]
            roots += [m for ln in found for m in _imported(ln)]
    out["pth"] = hashlib.sha256("\n".join(lines).encode()).hexdigest() if lines else None
    out["pth_modules"] = _closure(sorted(set(roots))) if roots else None
    return out


def _site_folders():
    """The folders installed distributions live in (site-packages, the user's where it is used)."""
    import site
    folders = list(getattr(site, "getsitepackages", list)())
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return folders


def _imported(source):
    """The top-level modules `source` imports by name (import x, from x import y, and a call of
    import_module or __import__ with a literal name), or []. (A name computed at run time cannot
    be read from the text; the file that computes it is hashed all the same.)"""
    import ast
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value[:1] not in ("", ".") \
                and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__"):
            out.append(node.args[0].value.split(".")[0])
    return out


def _closure(names, first=None, limit=256):
    """{module: sha256 of its files} of the modules `names` (the first at `first`, where it was
    imported from) and of the modules they import by name: a module's own file, or for a package
    (a namespace one too) every .py file under it, hashed through the hash record; what a module's
    file or a package's __init__ imports is followed, to the end. The standard library's modules
    and what an installed folder (site-packages) holds are named by where they come from, never
    read; this package's are in the code digest."""
    from importlib.machinery import PathFinder
    stdlib = os.path.dirname(os.__file__)
    installed = _installed_folders()
    todo, out = list(names), {}
    while todo and len(out) < limit:
        name = todo.pop(0)
        if name in out or name == __name__.split(".")[0]:
            continue
        if name in sys.builtin_module_names:
            out[name] = "builtin"
            continue
        root = first is not None and name == names[0]   # (the start-up file itself: always read)
        if root:
            origin, places = first, None
        else:
            spec = PathFinder.find_spec(name, sys.path)
            if spec is None:
                out[name] = None
                continue
            origin, places = spec.origin, list(spec.submodule_search_locations or ()) or None
        where = os.path.realpath(places[0] if places else origin or "")
        if not root and any(where.startswith(d + os.sep) for d in installed):
            out[name] = "installed"
            continue
        if not root and where.startswith(stdlib + os.sep):
            out[name] = "stdlib"
            continue
        files = [origin] if not places else [f for d in places for f in _package_files(d)]
        files = [f for f in files if f]
        out[name] = _files_digest(files, where if places else os.path.dirname(where))
        entry = [f for f in files if not places or os.path.basename(f) == "__init__.py"][:1]
        for path in entry:   # (a package's other modules are hashed, not followed)
            try:
                with open(path, "rb") as f:
                    todo += _imported(f.read(1 << 22))
            except OSError:
                pass
    return out


def _package_files(folder, limit=512):
    """The code files under `folder` (.py, extension modules), sorted, at most `limit`."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        found += [os.path.join(dirpath, n) for n in sorted(filenames) if n.endswith(CODE_SUFFIXES)]
        if len(found) > limit:
            break
    return found[:limit]


def loader_libraries():
    """{library file name: sha256} of what the dynamic loader puts before the system's (each file
    LD_PRELOAD or /etc/ld.so.preload names, each shared object in LD_LIBRARY_PATH's folders), or
    None: a library rebuilt at the same path is another environment. Through the hash record."""
    from ..fingerprint import sha256_or_none
    paths = os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
    try:
        with open("/etc/ld.so.preload", encoding="utf-8", errors="replace") as f:
            paths += f.read(1 << 16).split()
    except OSError:
        pass
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        try:
            paths += [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if ".so" in n][:2048]
        except OSError:
            continue
    return {f"{i}:{os.path.basename(p)}": sha256_or_none(p) for i, p in enumerate(paths[:4096])} or None


def libc():
    """The C library's name and version (its libm computes the VM's math.erf, exp, sin)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        import platform
        return " ".join(platform.libc_ver()).strip() or None


@functools.lru_cache(maxsize=4)
def _installed(path):
    """What the interpreter, the CPU and the libraries on `path` (sys.path, as a tuple) are: read
    once per process and path, not once per check (0.8 ms)."""
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "implementation": sys.implementation.name,
        "machine": os.uname().machine,
        "system": sys.platform,
        **cpu.describe(),
        "cpu_count": os.cpu_count(),
        **versions(("numpy", "torch")),
        "records": records(("numpy", "torch")),
        "imports": origins(COMPUTING),
        "numpy_libs": bundled_libraries("numpy"),
        "libc": libc(),
        "startup": startup(),
    }


def fingerprint():
    """The environment a lock's numbers depend on, as far as it is known without importing them."""
    return {
        **_installed(tuple(sys.path)),
        "thread_env": {k: os.environ[k] for k in THREAD_VARS if k in os.environ},
        "numerics_env": {k: os.environ[k] for k in NUMERICS_VARS if k in os.environ},
        "loader_env": {k: os.environ[k] for k in LOADER_VARS if os.environ.get(k)},   # ("" is unset)
        "loader_libraries": loader_libraries(),
    }


def digest(fp):
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


def describe(np, torch):
    """The fingerprint and its digest, with the BLAS, the thread counts and torch's kernel level
    (what ATEN_CPU_CAPABILITY and the CPU came to) the lock ran with."""
    fp = fingerprint()
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        blas = None
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = None
    return {**fp, "digest": digest(fp), "numpy_blas": blas, "torch_cpu_capability": capability,
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads()}
