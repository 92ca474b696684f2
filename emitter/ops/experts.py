"""Routed experts (mixture of experts): the routers, which turn each token's router logits into a
row of routing weights (zero for the experts not chosen), and the experts, which sum the chosen
SwiGLU experts' outputs by those weights.

- `softmax routing` (Qwen3-MoE, Qwen3-Next, Mixtral): softmax over the experts, the top K kept,
  renormalised to sum 1 when the sentence says so;
- `sigmoid routing` (DeepSeek-V3): scores sigmoid(logits); the experts chosen by score + bias
  within the best G of N groups (a group's score: the sum of its two best biased scores); the
  weights the chosen experts' unbiased scores, renormalised if said, times the scaling factor;
- `experts`: every expert's gate, up and down projections side by side in three 2-D tables.

Top-k ties go to the lower expert index (group index for groups), in the VM and the module alike.
The VM evaluates only the chosen experts, token by token; the module computes every expert and
weights each by its routing weight (zero when not chosen): fixed shapes, no data-dependent gather,
which is what a static dataflow graph (SambaFlow's, torch.fx's) can trace.
"""

from .base import Op, ShapeError, fmt, np, np_sigmoid, np_silu, np_softmax


def _routing_shape(a, groups=False):
    rows, n = a.shape("L")
    k = a.int("K")
    if k > n:
        raise ShapeError(f"cannot choose {k} of the {n} experts `{a.name('L')}` scores")
    if a.has("B") and a.shape("B") != (1, n):
        raise ShapeError(f"the bias `{a.name('B')}` is {fmt(a.shape('B'))}, must be 1 by {n} "
                         "(one per expert)")
    if groups and a.has("N"):
        g, ng = a.int("G"), a.int("N")
        if n % ng:
            raise ShapeError(f"{ng} groups do not divide the {n} experts")
        if ng > 1 and n // ng < 2:
            raise ShapeError(f"a group's score is its two best experts': {ng} groups of {n // ng}")
        if g > ng:
            raise ShapeError(f"cannot keep {g} of {ng} groups")
        if k > g * (n // ng):
            raise ShapeError(f"cannot choose {k} experts within {g} groups of {n // ng}")
    return rows, n


def _top(scores, k):
    """(mask of the k largest of each row, ties to the lower index; each row's margin: its k-th
    largest minus its (k+1)-th, inf where nothing is left out)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    mask = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(mask, order[:, :k], True, axis=1)
    if k >= scores.shape[1]:
        return mask, np.full(scores.shape[0], np.inf)
    ranked = np.take_along_axis(scores, order[:, k - 1:k + 1], axis=1)
    with np.errstate(invalid="ignore"):
        return mask, np.nan_to_num(ranked[:, 0] - ranked[:, 1], nan=np.inf)


def _choosable(scores, mask, tol):
    """Per row: whether `mask` is a top choice of `scores` within `tol` (per row) of a tie: each
    chosen score at least each other score less `tol`, the VM's margin rule for every pair
    swapped (-inf: never chosen)."""
    with np.errstate(invalid="ignore"):
        lo = np.where(mask, scores, np.inf).min(axis=1)
        hi = np.where(mask, -np.inf, scores).max(axis=1)
        return np.isfinite(lo) & (lo - hi >= -np.asarray(tol)) | ~mask.any(axis=1)


def softmax_choosable(a, mask, tol, rows=None):
    """Per token: whether the experts `mask` chose are a top K of p within `tol` of a tie (a
    choice rounding can make), not only of the same number."""
    return _choosable(np_softmax(a["L"], axis=1), mask, tol)


def softmax_routing_shape(a):
    return _routing_shape(a)


def softmax_selection(a):
    """(the chosen experts as a mask, each token's margin, the scores chosen by): the top K of
    p = softmax(l), per row."""
    p = np_softmax(a["L"], axis=1)
    return _top(p, a.int("K")) + (p,)


def softmax_weights(a, mask):
    """The routing weights of the experts in `mask`: their p, divided by their sum if renormalised."""
    w = np_softmax(a["L"], axis=1) * mask
    return w / w.sum(axis=1, keepdims=True) if a.has("renormalised") else w


def softmax_routing_vm(a):
    """Per row: p = softmax(l); the top K of p kept (divided by their sum if renormalised)."""
    return softmax_weights(a, softmax_selection(a)[0])


def softmax_routing_call(a):
    return f"softmax_routing({a.name('L')}, {a.int('K')}, {a.has('renormalised')})"


def sigmoid_routing_shape(a):
    return _routing_shape(a, groups=True)


def _biased(a):
    """(c = sigmoid(l) + bias, the number of groups, each group's score: the sum of its two best c,
    or None for one group)."""
    c = np_sigmoid(a["L"]) + (a["B"] if a.has("B") else 0.0)
    groups = a.int("N") if a.has("N") else 1
    rows, n = c.shape
    return c, groups, np.sort(c.reshape(rows, groups, n // groups), axis=2)[:, :, -2:].sum(axis=2) \
        if groups > 1 else None


def sigmoid_selection(a):
    """(mask, margin, scores): c = sigmoid(l) + bias; the best G groups by the sum of each group's
    two best c, then the top K of c within them. A token's margin is the smaller of the experts'
    (K-th against (K+1)-th c among the kept groups) and the groups' (G-th against (G+1)-th)."""
    c, groups, score = _biased(a)
    rows, n = c.shape
    margin = np.full(rows, np.inf)
    if groups > 1:
        keep, margin = _top(score, a.int("G"))
        c = np.where(np.repeat(keep, n // groups, axis=1), c, -np.inf)
    mask, experts = _top(c, a.int("K"))
    return mask, np.minimum(margin, experts), c


def sigmoid_choosable(a, mask, tol, rows=None):
    """Per token (of `rows`, all where None; the others False): whether the experts `mask` chose
    are a choice of sigmoid_selection's on biased scores within `tol` of a tie with the VM's (each
    chosen at least each other less `tol`; a group's score, two of them, less twice that): their
    groups with the best of the others whose experts none of the chosen would lose to, up to G, a
    top G of the groups (those others, best first, are the choice that rules out least), and the
    experts a top K within them."""
    c, groups, score = _biased(a)
    n_rows, n = c.shape
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), (n_rows,))
    if groups == 1:
        return _choosable(c, mask, tol)
    size, keep = n // groups, a.int("G")
    used = mask.reshape(n_rows, groups, size).any(axis=2)
    out = np.zeros(n_rows, dtype=bool)
    for t in range(n_rows) if rows is None else rows:
        if not mask[t].any() or used[t].sum() > keep:
            continue
        weakest = c[t][mask[t]].min()
        harmless = [g for g in np.argsort(-score[t], kind="stable")
                    if not used[t, g] and c[t].reshape(groups, size)[g].max() <= weakest + tol[t]]
        kept = used[t].copy()
        kept[harmless[:keep - int(used[t].sum())]] = True
        within = np.where(np.repeat(kept, size), c[t], -np.inf)
        out[t] = kept.sum() == keep and _choosable(score[t:t + 1], kept[None], 2 * tol[t:t + 1])[0] and \
            _choosable(within[None], mask[t:t + 1], tol[t:t + 1])[0]
    return out


def sigmoid_weights(a, mask):
    """The routing weights of the experts in `mask`: their unbiased sigmoid(l), divided by their sum
    if renormalised, times F."""
    w = np_sigmoid(a["L"]) * mask
    if a.has("renormalised"):
        w = w / w.sum(axis=1, keepdims=True)
    return w * a.real("F", 1.0)


def sigmoid_routing_vm(a):
    """Per row: s = sigmoid(l), c = s + bias; the best G groups by the sum of each group's two
    best c; the top K of c within them; weights s there (/ their sum if renormalised) · F."""
    return sigmoid_weights(a, sigmoid_selection(a)[0])


def sigmoid_routing_call(a):
    bias = a.name("B") if a.has("B") else "None"
    groups = f"{a.int('G')}, {a.int('N')}" if a.has("N") else "1, 1"
    return (f"sigmoid_routing({a.name('L')}, {bias}, {a.int('K')}, {groups}, "
            f"{a.has('renormalised')}, {a.real('F', 1.0)!r})")


# each router's (selection, weights given a selection, whether a choice is one within rounding of
# the VM's scores): the lock's bf16 gate tells a routing flip from a wrong router with these
ROUTERS = {"softmax routing": (softmax_selection, softmax_weights, softmax_choosable),
           "sigmoid routing": (sigmoid_selection, sigmoid_weights, sigmoid_choosable)}


def experts_count(a):
    """The number of experts: the routing weights' columns, which must split the tables evenly."""
    (rows, d), (rr, n) = a.shape("X"), a.shape("R")
    if rr != rows:
        raise ShapeError(f"the routing weights `{a.name('R')}` have {rr} rows, `{a.name('X')}` "
                         f"has {rows} (one row of weights per token)")
    dg, cols = a.shape("WG")
    if dg != d or cols % n:
        raise ShapeError(f"`{a.name('WG')}` is {fmt((dg, cols))}, must be {d} by {n}·F "
                         f"({n} experts' gate projections side by side)")
    f = cols // n
    if a.shape("WU") != (d, cols):
        raise ShapeError(f"`{a.name('WU')}` is {fmt(a.shape('WU'))}, must be {fmt((d, cols))} "
                         f"like `{a.name('WG')}`")
    if a.shape("WD") != (cols, d):
        raise ShapeError(f"`{a.name('WD')}` is {fmt(a.shape('WD'))}, must be {fmt((cols, d))} "
                         f"({n} experts' down projections stacked, {f} rows each)")
    return n, f


def experts_shape(a):
    experts_count(a)
    return a.shape("X")


def experts_vm(a):
    """Per row t, over the experts e with a nonzero weight (ascending): the sum of
    R[t, e] · (silu(x WG_e) ⊙ x WU_e) WD_e, where WG_e, WU_e are columns e·F … e·F + F − 1 and WD_e
    the same rows. Only those slices are read (widened to float64)."""
    n, f = experts_count(a)
    x, r = a["X"], a["R"]
    wg, wu, wd = a.held("WG"), a.held("WU"), a.held("WD")
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e in np.flatnonzero(r[t]):
            cols = slice(e * f, (e + 1) * f)
            g = x[t] @ np.asarray(wg[:, cols], dtype=np.float64)
            u = x[t] @ np.asarray(wu[:, cols], dtype=np.float64)
            out[t] += r[t, e] * ((np_silu(g) * u) @ np.asarray(wd[cols], dtype=np.float64))
    return out


def experts_call(a):
    n, _ = experts_count(a)
    names = ", ".join(a.name(p) for p in ("X", "R", "WG", "WU", "WD"))
    return f"experts({names}, {n})"


OPS = (
    Op("softmax routing", "softmax routing of L choosing K [renormalised]",
       shape=softmax_routing_shape, vm=softmax_routing_vm, call=softmax_routing_call,
       spelling="softmax_routing(l, k, renormalised)", ints=("K",)),
    Op("sigmoid routing", "sigmoid routing of L [with bias B] choosing K [in G of N groups] "
       "[renormalised] [scaled by F]", shape=sigmoid_routing_shape, vm=sigmoid_routing_vm,
       call=sigmoid_routing_call,
       spelling="sigmoid_routing(l, bias, k, groups_kept, groups, renormalised, factor)",
       ints=("K", "G", "N"), reals=("F",), params=("B",)),
    Op("experts", "experts of X weighted by R with gate WG up WU down WD", shape=experts_shape,
       vm=experts_vm, call=experts_call, spelling="experts(x, r, wg, wu, wd, n)",
       params=("WG", "WU", "WD"),   # the module's dense form: x·WG, x·WU, silu, product, R spread
       scratch=lambda a: 5 * a.shape("X")[0] * a.shape("WG")[1]),
)
