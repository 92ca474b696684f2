"""Importing this module loads all of the lock code into the process (a Dask worker, the forkserver
its workers are forked from, or the driver running checks inline) and records what was loaded:
`LOADED`, the code's location-free digest, taken before and after the imports (and `LOADED_VM`,
the VM's part, which a VM trace's key names). Each check reports
it, and the driver refuses a verdict from code other than the code its key names. Loaded all at
once, none of it later: a module imported lazily by some check could otherwise be an edited one
under the digest taken at the start. Files that changed while they were being imported leave
`LOADED` a digest no run has ("moved:…"); the package's checked-hash .pyc files (emitter/bytecode.py)
make what is imported the bytes that were hashed."""

import importlib

from .digests import code_files, package_digest

_PKG = __name__.rsplit(".", 2)[0]


def _module(rel):
    name = rel[:-len(".py")].replace("/", ".")
    if name == "__init__":
        return _PKG
    return f"{_PKG}.{name[:-len('.__init__')]}" if name.endswith(".__init__") else f"{_PKG}.{name}"


_before, _vm = package_digest("lock"), package_digest("vm")   # (the VM's files are lock code too)
for _rel in code_files("lock"):
    importlib.import_module(_module(_rel))
_after = package_digest("lock")
LOADED = _before if _before == _after else f"moved:{_before}:{_after}"
# the VM's code as loaded, which a VM trace's key names: taken with LOADED, never later (vm.py
# edited after the imports would key this code's trace under the edit's digest)
LOADED_VM = _vm if _before == _after else LOADED
