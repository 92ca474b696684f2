"""Which CPU a check runs on, as far as it moves the figures: its instruction-set level, the
features beside it that pick other kernels, and its maker and model (read from /proc/cpuinfo)."""

# instruction-set levels, best first: the first the CPU has names its level
ISA = ("avx512f", "avx2", "avx", "sse4_2", "sve", "asimd", "neon")
# the features beside the level that choose another kernel (torch's bf16 matmul on AVX512_BF16 or
# AMX, oneDNN's VNNI paths, FMA in libm and OpenBLAS): two CPUs of one level may differ in these
FEATURES = ("fma", "f16c", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni",
            "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "bf16", "i8mm", "sve2")


# the CPU's maker and model (x86's vendor, family and model; Arm's implementer and part): MKL,
# oneDNN and OpenBLAS pick kernels by them as well as by flags (a Zen 3 and a Skylake show one level)
CPUINFO = "/proc/cpuinfo"
IDENTITY = ("vendor_id", "cpu family", "model", "CPU implementer", "CPU part")


def describe():
    """The CPU's instruction-set level, its features of FEATURES and its maker and model (the first
    processor's, from /proc/cpuinfo: Arm lists its part after its features)."""
    seen, flags = {}, None
    try:
        with open(CPUINFO, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if not key and flags is not None:   # (the first processor's block ends)
                    break
                if key in IDENTITY:
                    seen.setdefault(key, value.strip())
                elif key in ("flags", "Features") and flags is None:
                    flags = set(value.split())
    except OSError:
        pass
    if flags is None:
        return {"isa": "unknown", "cpu_features": None, "cpu_model": None}
    return {"isa": next((x for x in ISA if x in flags), "baseline"), "cpu_features": [x for x in FEATURES if x in flags],
            "cpu_model": " ".join(f"{k}={seen[k]}" for k in IDENTITY if k in seen) or None}
