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


def one_minus_cos(o):
    """1 − cosine of the output, the honest way to show a cosine of 0.9999999."""
    c = (o or {}).get("cosine")
    return None if c is None else max(0.0, 1.0 - c)


def where(s):
    """`stage 7 `q = matmul` (line 12, step 2)` for a stage label (an op, `load`, `write-back`)."""
    stage = s.get("stage")
    head = f"stage {stage}" if isinstance(stage, int) else str(stage)
    text = f"{head} `{s.get('out')} = {s.get('op')}` (line {s.get('line')}"
    return text + (f", step {s['step']})" if s.get("step") is not None else ")")


def describe_flip(f):
    """`token 3: the VM chose experts [1, 5], the module [1, 6] (…margin…, …noise…)`: a routing
    flip of the bf16 gate (emitter.verify.routing)."""
    return (f"token {f['token']}: the VM chose experts {f['vm']}, the module {f['module']} "
            f"(the VM's margin {number(f['margin'])}, the router's bf16 noise {number(f['noise'])})")


def describe(r, limit=240):
    """Why a check passed or not: the reason of an error; else the first diverging stage, the
    stage furthest from its tolerance (as a ratio of it) and the output's figures, an integer
    output (a token) with the figures of the stage that feeds it."""
    if r.get("verdict") == "error":
        return short(r.get("reason") or "error", limit)
    parts = []
    f = r.get("first_divergence")
    if f:
        parts.append(f"first diverging op: {where(f)}, max abs {number(f.get('max_abs'))}")
    w = r.get("worst")
    if w:   # under the bf16 gate, the op furthest towards any bound, `by` naming which
        bound = f"its {w['by']} bound" if w.get("by") else "its tolerance"
        parts.append(f"worst: {where(w)} at {number(w.get('ratio'))}× {bound}")
    g = r.get("bf16")
    if g:
        we, wz, mc = g.get("worst_excess") or {}, g.get("worst_z") or {}, g.get("min_cosine") or {}
        wd = g.get("worst_deviation") or {}
        parts.append(f"bf16 gate: worst excess {number(we.get('excess'))} (bound {number(we.get('limit'))}) "
                     f"at `{we.get('out')} = {we.get('op')}`, worst deviation "
                     f"{number(wd.get('deviation'))} (bound {number((g.get('bounds') or {}).get('deviation'))}) "
                     f"at `{wd.get('out')}`, worst |z| {number(wz.get('z'))} at "
                     f"`{wz.get('out')}`, min cosine {number(mc.get('cosine'))}, "
                     f"{g.get('ops_failing', 0)} op(s) failing")
        rf = g.get("routing_failed")
        if rf:   # a router's other choice the gate does not excuse: named first
            parts.insert(0, f"routing: {where(rf)} {describe_flip(rf)}, outside its noise")
        elif g.get("routing_flips"):
            parts.append(f"{g['routing_flips']} routing flip(s) excused")
    o = r.get("output") or {}
    if o.get("integer"):
        text = "integer output " + ("agrees" if not o.get("integer_mismatches") and o.get("pass", True)
                                    else "DIFFERS")
        feed = o.get("feeding")
        if feed:
            text += (f"; its input `{feed.get('out')}` max abs {number(feed.get('max_abs'))}, "
                     f"guarded rel {number(feed.get('guarded_rel'))}, "
                     f"{number(feed.get('worst_ratio'))}× tolerance")
        parts.append(text)
    elif o:
        parts.append(f"output max abs {number(o.get('max_abs'))}, guarded rel "
                     f"{number(o.get('guarded_rel'))}, 1−cos {number(one_minus_cos(o))}")
    return short("; ".join(parts) or "no figures", limit)


def line(r):
    """`[dtype] VERDICT: why` for one result."""
    return f"[{r.get('dtype')}] {str(r.get('verdict')).upper()}: {describe(r, 300)}"
