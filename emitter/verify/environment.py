"""What a verdict depends on beyond its inputs: the machine and the numeric stack.

`fingerprint()` is cheap and standard-library only (no numpy, no torch imported: the dodo computes
it on every run, so a torch or numpy upgrade reruns every lock); `describe(np, torch)` adds what
only the imported libraries can say (the BLAS, the thread counts) for the lock's result."""

import hashlib
import json
import os
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
               "OPENBLAS_L2_SIZE", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
# instruction-set levels, best first: the first the CPU has names its level
ISA = ("avx512f", "avx2", "avx", "sse4_2", "sve", "asimd", "neon")


def _isa():
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = set(line.split(":", 1)[1].split())
                    return next((x for x in ISA if x in flags), "baseline")
    except OSError:
        pass
    return "unknown"


def versions(names):
    """Installed distributions' versions, read from their dist-info folder names on sys.path
    (importlib.metadata takes ~50 ms per lookup; this lists each folder once)."""
    found = {}
    for base in sys.path:
        try:
            entries = os.listdir(base or ".")
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(".dist-info"):
                name, _, version = entry[:-len(".dist-info")].rpartition("-")
                key = name.lower().replace("-", "_")
                if key in names and key not in found:
                    found[key] = version
    return {n: found.get(n) for n in names}


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


def fingerprint():
    """The environment a lock's numbers depend on, as far as it is known without importing them."""
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "implementation": sys.implementation.name,
        "machine": os.uname().machine,
        "system": sys.platform,
        "isa": _isa(),
        "cpu_count": os.cpu_count(),
        **versions(("numpy", "torch")),
        "numpy_libs": bundled_libraries("numpy"),
        "thread_env": {k: os.environ[k] for k in THREAD_VARS if k in os.environ},
    }


def digest(fp):
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()


def describe(np, torch):
    """The fingerprint and its digest, with the BLAS and the thread counts the lock ran with."""
    fp = fingerprint()
    try:
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        blas = f"{blas.get('name')} {blas.get('version')}"
    except (AttributeError, KeyError, TypeError):
        blas = None
    return {**fp, "digest": digest(fp), "numpy_blas": blas,
            "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads()}
