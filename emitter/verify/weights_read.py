"""The weights files a check read: one digest of them, and whether they are still the bytes its
key names when the check reads them and when it ends (a file that moved in between is an error,
or the bundle's fault where the bundle held it open to write)."""

import hashlib
import os

from ..fingerprint import sha256 as _sha256, sha256_or_none
from .probe import BundleFault, CouldNotRun
from .resident import held_for_writing


def weights_digest(weights_dir, sources):
    """One sha256 over the leaf files the run read (name and content), or None for none."""
    files = sorted({f for f in sources.values() if f != "declared"})   # a .safetensors: once
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f}\0{_sha256(os.path.join(weights_dir, f))}\n".encode())
    return h.hexdigest()


def as_manifest(result, weights_dir, sources, shas):
    """The weights files read are those the weights manifest (and a cache key) name, or by hand
    those the VM read, else an error: one changed after they were taken, before or during the
    check (a loader that writes into its files too; a file's memo holds while its stat does, so
    a file unchanged costs a stat)."""
    moved = [f for f in sorted(set(sources.values()) - {"declared"})
             if shas is not None and sha256_or_none(os.path.join(weights_dir, f)) != shas.get(f)]   # (gone: moved)
    if moved:
        result["stale_weights"] = moved
        raise CouldNotRun(f"{weights_dir}: {', '.join(moved[:3])}{' and more' if moved[3:] else ''} "
                          "changed after the check's key was taken, or while it ran (a loader that writes into its "
                          "files?): run it again")


def still_as_read(result, weights_dir, sources, shas, opened, maybe=frozenset()):
    """_`as_manifest` at the end of a check: a file that changed while the bundle held it open to
    write (a loader mapping its files writable, a forward writing through it), or that the bundle
    opened to write (`opened`, real paths: resident.Watching), is the bundle's doing, a fail
    naming the file and its leaves; another change is an error (run it again)."""
    try:
        as_manifest(result, weights_dir, sources, shas)
    except CouldNotRun:
        folder = os.path.realpath(weights_dir)   # (a file as it lies there, and where its link leads)
        moved = {**{os.path.join(folder, f): f for f in result["stale_weights"]},
                 **{os.path.realpath(os.path.join(weights_dir, f)): f for f in result["stale_weights"]}}
        mine = sorted({moved[p] for p in held_for_writing(set(moved)) | (set(moved) & (opened | maybe))}
                      | (set(moved.values()) if folder in opened else set()))   # (the folder renamed, removed)
        if not mine:
            raise
        leaves = ", ".join(f"`{n}`" for n, f in sorted(sources.items()) if f == mine[0])
        raise BundleFault({"stage": "load", "out": None, "op": "load_weights", "line": None},
                          f"the bundle wrote into the weights file {mine[0]} ({leaves}) while it ran: it "
                          "holds it open to write, and its content is not what the check read") from None

