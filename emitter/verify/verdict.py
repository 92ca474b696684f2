"""The one formatter of a verdict: a lock result (or the slim row the report keeps of one) as a
line a person reads. Standard library only."""


def short(text, limit=240):
    """Text cut to one readable line of printable characters (program text may carry control
    characters that XML 1.0 cannot hold); a `quoted` piece cut open is closed."""
    text = "".join(c if c.isprintable() else " " for c in str(text))
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    if cut.count("`") % 2 == 0:
        return cut + "…"
    return cut[:-1] + "…" if cut.endswith("`") else cut[:-1] + "…`"


def number(x):
    """A figure in three significant digits; '-' for none."""
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def one_minus_cos(o):
    """1 − cosine of the output, the honest way to show a cosine of 0.9999999."""
    c = (o or {}).get("cosine")
    return None if c is None else max(0.0, 1.0 - c)


def where(s):
    """`stage 7 `q = matmul` (line 12, step 2)` for a stage label (an op, `load`, `write-back`;
    a part of the bundle no stage names, `import (model.py)`)."""
    stage = s.get("stage")
    head = f"stage {stage}" if isinstance(stage, int) else str(stage)
    what = f" `{s.get('out')} = {s.get('op')}`" if s.get("out") is not None else f" ({s.get('op')})"
    at = ([f"line {s['line']}"] if s.get("line") is not None else []) + \
        ([f"step {s['step']}"] if s.get("step") is not None else [])
    return head + what + (f" ({', '.join(at)})" if at else "")


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
    if f and f.get("raised"):   # the bundle raised there (or skipped that stage): no figures
        parts.append(f"first diverging op: {where(f)}: {short(f['raised'], 200)}")
    elif f:
        parts.append(f"first diverging op: {where(f)}, max abs {number(f.get('max_abs'))}"
                     + (f", {f['nonfinite']} value(s) NaN or Inf on one side only" if f.get("nonfinite") else ""))
    w = r.get("worst")
    if w and not (w.get("ratio") is None and f and f.get("raised")):   # (a raise ranks no figures)
        # under the bf16 gate, the op furthest towards any bound, `by` naming which
        bound = f"its {w['by']} bound" if w.get("by") else "its tolerance"
        parts.append(f"worst: {where(w)}, not its exact floor value for value (it only moves values)"
                     if w.get("by") == "floor" else f"worst: {where(w)}, where the module raised"
                     if w.get("ratio") is None and r.get("raised") else
                     f"worst: {where(w)} at {number(w.get('ratio'))}× {bound}")
    g = r.get("bf16")
    if g:
        we, wz, mc = g.get("worst_excess") or {}, g.get("worst_z") or {}, g.get("min_cosine") or {}
        wd = g.get("worst_deviation") or {}
        if not (we or wz or mc or wd):
            parts.append("bf16 gate: no op judged")
        else:
            parts.append(f"bf16 gate: worst excess {number(we.get('excess'))} (bound {number(we.get('limit'))}) "
                         f"at `{we.get('out')} = {we.get('op')}`, worst deviation "
                         f"{number(wd.get('deviation'))} (bound {number((g.get('bounds') or {}).get('deviation'))}) "
                         f"at `{wd.get('out')}`, worst |z| {number(wz.get('z'))} at "
                         f"`{wz.get('out')}`, worst 1−cos {number(one_minus_cos(mc))}, "
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


UNMATCHED_SAID = 10   # lines of a folder's stray files: a folder of thousands says how many more


def unmatched(weights, names):
    """The terminal's warning lines for the files of the weights folder `weights` that no leaf of
    the program claims (`names`, a result's `unmatched_weights`): a stray `b1_old.f64` is likely a
    leaf renamed, or a file meant for another program. The first UNMATCHED_SAID, then a count."""
    names = list(names)
    more = [f"warning: {weights}: {len(names) - UNMATCHED_SAID} more files match no leaf of the program "
            "(ignored)"] if len(names) > UNMATCHED_SAID else []
    return [f"warning: {weights}: `{short(n, 120)}` matches no leaf of the program (ignored)"
            for n in names[:UNMATCHED_SAID]] + more


def _gate_figure(g, by):
    """The bf16 gate's own figure for the bound `by` (the worst op's, beside that bound)."""
    b = g.get("bounds") or {}
    pick = {"excess": ("worst_excess", "excess", None), "deviation": ("worst_deviation", "deviation", "deviation"),
            "z": ("worst_z", "z", "z"), "cosine": ("min_cosine", "cosine", "cosine")}.get(by)
    if pick is None:
        return None
    s = g.get(pick[0]) or {}
    limit = s.get("limit") if pick[2] is None else b.get(pick[2])
    if by == "cosine":
        return (f"1−cos {number(one_minus_cos(s))}, bound "
                f"{number(None if limit is None else 1.0 - limit)}")
    return f"{'|z|' if by == 'z' else by} {number(s.get(pick[1]))}, bound {number(limit)}"


def decisive(r):
    """Which bound decided a check's verdict, and its figure, or None (an error: its reason says).

    {"bound": what was measured against, "ratio": the figure as a share of it (1: at it), "at":
    the stage, "figure": the raw figure beside its bound, "output": how the output was judged,
    "decides": whether this bound made the verdict fail}. Under the bf16 gate the flat tolerance
    decides nothing: each op is judged against its own bounds (`worst.by`: the one it came nearest)
    and the output by its cosine (a token: a flip only inside the logits' noise); the output's max
    abs and guarded rel are shown, not judged."""
    if r.get("verdict") not in ("pass", "fail"):
        return None
    w, o, g = r.get("worst") or {}, r.get("output") or {}, r.get("bf16")
    if not w and not o:          # an emit-only check: nothing measured
        return None
    ratio, fail = w.get("ratio"), r["verdict"] == "fail"
    out = None
    if o.get("integer"):
        out = "token agrees" if not o.get("integer_mismatches") and o.get("pass", True) else "token DIFFERS"
    elif o and g:   # a cosine near 1 reads as 1 − cosine
        bound = (g.get("bounds") or {}).get("cosine")
        out = f"1−cos {number(one_minus_cos(o))} (bound {number(None if bound is None else 1.0 - bound)})"
    if g:
        by = w.get("by")
        d = {"bound": f"{by} bound" if by else "gate's bounds", "figure": _gate_figure(g, by)}
    else:
        tol = r.get("tolerance") or {}
        d = {"bound": "tolerance",
             "figure": f"abs {number(tol.get('abs'))}, rel {number(tol.get('rel'))}" if tol else None}
    d.update(ratio=ratio, at=where(w) if w else None, output=out, decides=fail)
    within = ratio is not None and ratio <= 1
    if fail and within and o.get("pass") is False:        # every op within: the output decided
        what = "token" if o.get("integer") else "output's cosine" if g else "output"
        d.update(bound=what, ratio=None if g or o.get("integer") else o.get("worst_ratio"),
                 at=None, figure=out if g or o.get("integer") else None)
    elif fail and within and r.get("first_divergence"):   # a state, past the stages' worst
        d.update(ratio=None, at=where(r["first_divergence"]), figure=None)
    return d


def decided(d, compact=False):
    """A `decisive` as words: `0.25× excess bound` (compact), else which bound, where and how far."""
    if d is None:
        return ""
    ratio = f"{number(d['ratio'])}×" if d["ratio"] is not None else ""
    if compact:
        return f"{ratio} {d['bound']}".strip()
    if d["decides"]:
        text = f"decided by its {d['bound']}" + (f": {ratio}" if ratio else "")
    else:
        text = f"{ratio} its {d['bound']}" if ratio else f"within its {d['bound']}"
    text += f" at {d['at']}" if d["at"] else ""
    text += f": {d['figure']}" if d["figure"] else ""
    return text + (f"; output {d['output']}" if d["output"] and d["bound"] not in ("token", "output's cosine")
                   else "")
