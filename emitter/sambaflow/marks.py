"""The bundle's fixed marks and its program name."""

import functools

VENDOR_HEADER = "# vendor-ingestion artifact emitted by LOGOS — not our compute path"
TEMPLATE_MARK = "# TEMPLATE — SambaFlow API unverified"


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@functools.lru_cache(maxsize=8)
def program_name(source):
    """`logos_` + 16 hex of the source's FNV-1a 64: the bundle's name, in model.py and the manifest
    (kept for the last few sources: a check asks it of one source twice, 16 ms each for gemma3)."""
    return f"logos_{fnv1a64(source):016x}"
