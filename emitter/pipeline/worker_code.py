"""Importing this module loads all of the lock code into the process (a Dask worker, the forkserver
its workers are forked from, or the driver running checks inline) and records what was loaded:
`LOADED`, the code's location-free digest of each module as its import read it (and `LOADED_VM`,
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


_before = package_digest("lock")
for _rel in code_files("lock"):
    importlib.import_module(_module(_rel))
_after = package_digest("lock")
# each module as its import read it (one imported before, while doit loaded the dodo, too: an
# edit since is not the code that runs), and the VM's part, which a VM trace's key names
LOADED = package_digest("lock", loaded=True) if _before == _after else f"moved:{_before}:{_after}"
LOADED_VM = package_digest("vm", loaded=True) if _before == _after else LOADED
