"""An independent NumPy reading of docs/SUGAR.md, written element by element with plain loops.

Nothing here imports the emitter: the VM and the emitted torch helpers are both checked against it.
"""

import math

import numpy as np

EPS = 1e-6


def sigmoid(x):
    return np.vectorize(lambda t: 1.0 / (1.0 + math.exp(-t)) if t >= 0 else math.exp(t) / (1.0 + math.exp(t)))(x)


def silu(x):
    return x * sigmoid(x)


def gelu(x):
    def one(t):
        z = math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3)
        return t / (1.0 + math.exp(-2.0 * z))
    return np.vectorize(one)(x)


def exact_gelu(x):
    """x · Φ(x), Φ the standard normal CDF, written with erfc (not the VM's 1 + erf)."""
    return np.vectorize(lambda t: t * 0.5 * math.erfc(-t / math.sqrt(2.0)))(x)


def softmax_vec(v):
    m = max(v)
    e = [math.exp(t - m) for t in v]
    s = sum(e)
    return np.array([t / s for t in e])


def softmax(x):
    return np.array([softmax_vec(row) for row in x])


def _rows(flat, nr, nc):
    return [flat[i * nc:(i + 1) * nc] for i in range(nr)]


def rmsnorm(x, w=None, heads=None, residual=None, eps=EPS):
    x = x + residual if residual is not None else x
    flat = x.reshape(-1)
    nr, nc = (heads, flat.size // heads) if heads else x.shape
    out = []
    for row in _rows(flat, nr, nc):
        ms = sum(t * t for t in row) / nc
        out += [row[i] / math.sqrt(ms + eps) * (w.reshape(-1)[i] if w is not None else 1.0)
                for i in range(nc)]
    return np.array(out).reshape(x.shape)


def l2norm(x, heads=None):
    flat = x.reshape(-1)
    nr, nc = (heads, flat.size // heads) if heads else x.shape
    out = []
    for row in _rows(flat, nr, nc):
        n = math.sqrt(sum(t * t for t in row) + EPS)
        out += [t / n for t in row]
    return np.array(out).reshape(x.shape)


def rope(q, rc, rs, heads=None):
    cols = q.shape[1]
    half = rc.shape[1]
    hd = cols // heads if heads else 2 * half
    out = q.reshape(-1).copy()
    for h in range(cols // hd):
        for i in range(half):
            a, b = q[0, h * hd + i], q[0, h * hd + i + half]
            c, s = rc[0, i], rs[0, i]
            out[h * hd + i] = a * c - b * s
            out[h * hd + i + half] = a * s + b * c
    return out.reshape(1, cols)


def attention(q, k, v, heads, groups):
    hd = q.shape[1] // heads
    out = np.zeros((1, heads * hd))
    for h in range(heads):
        g = h // (heads // groups)
        qh = q[0, h * hd:(h + 1) * hd]
        scores = [sum(k[l, g * hd + j] * qh[j] for j in range(hd)) / math.sqrt(hd)
                  for l in range(k.shape[0])]
        p = softmax_vec(scores)
        for j in range(hd):
            out[0, h * hd + j] = sum(p[l] * v[l, g * hd + j] for l in range(k.shape[0]))
    return out


def full_attention(q, k, v, heads):
    t, cols = q.shape
    hd = cols // heads
    out = np.zeros_like(q)
    for h in range(heads):
        sl = slice(h * hd, (h + 1) * hd)
        for i in range(t):
            p = softmax_vec([float(q[i, sl] @ k[j, sl]) / math.sqrt(hd) for j in range(t)])
            out[i, sl] = sum(p[j] * v[j, sl] for j in range(t))
    return out


def layernorm(x, w, b, eps=EPS):
    out = np.zeros_like(x)
    for r in range(x.shape[0]):
        row = x[r]
        mean = sum(row) / len(row)
        var = sum((t - mean) ** 2 for t in row) / len(row)
        out[r] = [(row[i] - mean) / math.sqrt(var + eps) * w.reshape(-1)[i] + b.reshape(-1)[i]
                  for i in range(len(row))]
    return out


def causal_conv(x, wc, cs):
    ring = np.vstack([cs[1:], x])
    out = np.array([[sum(ring[t, c] * wc[t, c] for t in range(ring.shape[0]))
                     for c in range(x.shape[1])]])
    return out, ring


def decay(ar, dt, alog):
    return np.vectorize(lambda a, d, r: (1.0 + math.exp(a + d)) ** r)(ar, dt, alog)


def gated_delta(q, k, v, z, beta, alpha, s, gn, hv, hk):
    d = q.shape[1] // hk
    S = s.reshape(hv, d, d).copy()
    out = np.zeros((1, hv * d))
    for h in range(hv):
        g = h % hk
        kh, qh = k[0, g * d:(g + 1) * d], q[0, g * d:(g + 1) * d]
        vh, zh = v[0, h * d:(h + 1) * d], z[0, h * d:(h + 1) * d]
        a, b = alpha.reshape(-1)[h], beta.reshape(-1)[h]
        u = [sum(S[h, i, j] * kh[j] for j in range(d)) for i in range(d)]
        for i in range(d):
            for j in range(d):
                S[h, i, j] = a * S[h, i, j] + b * (vh[i] - a * u[i]) * kh[j]
        o = [sum(S[h, i, j] * qh[j] for j in range(d)) / math.sqrt(d) for i in range(d)]
        den = math.sqrt(sum(t * t for t in o) / d + EPS)
        for i in range(d):
            out[0, h * d + i] = gn.reshape(-1)[i] * o[i] / den * silu(np.array(zh[i]))
    return out, S.reshape(s.shape)


def swiglu(g, u):
    return silu(g) * u


def argmax(x):
    flat = list(x.reshape(-1))
    return np.array([[float(flat.index(max(flat)))]])


def row(table, tok):
    return table[int(tok)].reshape(1, -1).copy()


def set_row(table, pos, r):
    t = table.copy()
    t[int(pos)] = r.reshape(-1)
    return t


# ── routed experts: written from the model code's description, with plain loops ─────────────────

def _top(scores, k):
    """Indices of the k best scores: repeatedly the first maximum among those left (ties to the lower
    index), without a sort."""
    left, picked = list(range(len(scores))), []
    for _ in range(k):
        best = left[0]
        for e in left:
            if scores[e] > scores[best]:
                best = e
        picked.append(best)
        left.remove(best)
    return picked


def softmax_routing(logits, k, renormalised):
    out = np.zeros_like(logits)
    for t, row in enumerate(logits):
        p = softmax_vec(row)
        picked = _top(p, k)
        total = sum(p[e] for e in picked)
        for e in picked:
            out[t, e] = p[e] / total if renormalised else p[e]
    return out


def sigmoid_routing(logits, bias, k, kept=1, groups=1, renormalised=False, factor=1.0):
    out = np.zeros_like(logits)
    n = logits.shape[1]
    size = n // groups
    for t, row in enumerate(logits):
        s = [float(sigmoid(np.array(v))) for v in row]
        c = [s[e] + (0.0 if bias is None else bias[0, e]) for e in range(n)]
        if groups > 1:
            score = []
            for g in range(groups):
                members = c[g * size:(g + 1) * size]
                score.append(sum(members[i] for i in _top(members, 2)))
            allowed = {g * size + i for g in _top(score, kept) for i in range(size)}
            c = [c[e] if e in allowed else -math.inf for e in range(n)]
        picked = _top(c, k)
        total = sum(s[e] for e in picked)
        for e in picked:
            out[t, e] = (s[e] / total if renormalised else s[e]) * factor
    return out


def experts(x, r, wg, wu, wd):
    n = r.shape[1]
    f = wg.shape[1] // n
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e in range(n):
            if r[t, e] == 0.0:
                continue
            h = swiglu(x[t] @ wg[:, e * f:(e + 1) * f], x[t] @ wu[:, e * f:(e + 1) * f])
            out[t] += r[t, e] * (h @ wd[e * f:(e + 1) * f])
    return out
