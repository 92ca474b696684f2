"""The one formatter of a verdict: a lock result (or the slim row the report keeps of one) as a
line a person reads. Standard library only."""


def short(text, limit=240):
    """Text cut to one readable line of printable characters (program text may carry control
    characters that XML 1.0 cannot hold)."""
    text = "".join(c if c.isprintable() else " " for c in str(text))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def number(x):
    """A figure in three significant digits; '-' for none."""
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def describe(r, limit=240):
    """Why a check passed or not: the reason of an error, else the first diverging op (stage, line,
    step) and the output's figures."""
    if r.get("verdict") == "error":
        return short(r.get("reason") or "error", limit)
    o = r.get("output") or {}
    text = f"output max abs {number(o.get('max_abs'))}, max rel {number(o.get('max_rel'))}"
    if "argmax_agree" in o:
        text += f", argmax {'agrees' if o['argmax_agree'] else 'DIFFERS'}"
    f = r.get("first_divergence")
    if f:
        text = (f"first diverging op: stage {f.get('stage')} `{f.get('out')} = {f.get('op')}` "
                f"(line {f.get('line')}, step {f.get('step')}), max abs {number(f.get('max_abs'))}; "
                + text)
    return text


def line(r):
    """`[dtype] VERDICT: why` for one result."""
    return f"[{r.get('dtype')}] {str(r.get('verdict')).upper()}: {describe(r, 300)}"
