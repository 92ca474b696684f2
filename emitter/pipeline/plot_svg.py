"""A log-scale line plot written as SVG text by hand: report.html's one kind of plot needs no
plotting library (matplotlib took a fresh clone's report longer to draw than its verdicts took to
come from the cache). The same series give the same bytes."""

import html
import math

WIDTH, HEIGHT = 576, 200
LEFT, RIGHT, TOP, BOTTOM = 58, 8, 22, 46          # the frame's margins (the legend's row below)
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
FLOOR, CEILING = 1e-12, 1e12   # a zero ratio is drawn at FLOOR (log scale), an infinite one at CEILING


def _nice_step(span, most):
    """A step of 1, 2 or 5 times a power of ten giving at most `most` intervals over `span`."""
    raw = span / most
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def _num(v):
    return f"{v:.1f}".rstrip("0").rstrip(".")


def log_plot(title, series, xlabel, ylabel, mark=1.0, colours=None):
    """`series`: {label: [(x, y)]}, y drawn on a log axis (within FLOOR..CEILING; NaN left out), with a
    dashed red line at y = `mark` labelled "tolerance", drawn under the data; `colours` ({label:
    colour}) keeps a label's colour from plot to plot and its order is the drawing order (the last
    on top; other labels before them, sorted). The legend is a row below the frame, off the data.
    Returns the <svg> element."""
    rank = {k: i for i, k in enumerate(colours or {})}
    points = {k: [(float(x), min(max(float(y), FLOOR), CEILING)) for x, y in v if not math.isnan(y)]
              for k, v in sorted(series.items(), key=lambda kv: (rank.get(kv[0], -1), kv[0]))}
    points = {k: v for k, v in points.items() if v}
    xs = [x for v in points.values() for x, _ in v] or [0.0]
    logs = [math.log10(y) for v in points.values() for _, y in v] + [math.log10(mark)]
    lo, hi = math.floor(min(logs)), math.ceil(max(logs) + 0.3)   # the mark inside the frame
    if hi == lo:
        hi += 1
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (x - x0) / (x1 - x0) * w

    def py(y):
        return TOP + (hi - math.log10(y)) / (hi - lo) * h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="10">',
           f'<text x="{LEFT + w / 2:.1f}" y="14" text-anchor="middle" font-size="11">'
           f'{html.escape(title)}</text>']
    decade = max(1, math.ceil((hi - lo) / 8))
    for e in range(lo, hi + 1, decade):
        y = py(10.0 ** e)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + w}" y2="{y:.1f}" stroke="#ddd" '
                   f'stroke-width="0.5"/><text x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
                   f'1e{e:+03d}</text>')
    step = _nice_step(x1 - x0, 8)
    x = math.ceil(x0 / step) * step
    while x <= x1 + 1e-9:
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP + h}" x2="{px(x):.1f}" y2="{TOP + h + 4}" '
                   f'stroke="#444"/><text x="{px(x):.1f}" y="{TOP + h + 14}" text-anchor="middle">'
                   f'{_num(x)}</text>')
        x += step
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
    out.append(f'<text x="{LEFT + w / 2:.1f}" y="{TOP + h + 26}" text-anchor="middle">'
               f'{html.escape(xlabel)}</text>')
    out.append(f'<text transform="translate(11 {TOP + h / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{html.escape(ylabel)}</text>')
    ym = py(mark)
    out.append(f'<line x1="{LEFT}" y1="{ym:.1f}" x2="{LEFT + w}" y2="{ym:.1f}" stroke="#b00020" '
               f'stroke-dasharray="5 3"/>')
    legend = []
    for i, (label, v) in enumerate(points.items()):
        colour = (colours or {}).get(label) or COLOURS[i % len(COLOURS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in v)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        if len(v) < 60:
            out.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="1.6" fill="{colour}"/>'
                       for x, y in v)
        legend.append((label, colour, ""))
    legend.append(("tolerance", "#b00020", ' stroke-dasharray="5 3"'))
    x = LEFT
    for label, colour, dash in legend:    # one row under the axis label, left to right
        out.append(f'<line x1="{x}" y1="{HEIGHT - 7}" x2="{x + 16}" y2="{HEIGHT - 7}" stroke="{colour}" '
                   f'stroke-width="1.5"{dash}/><text x="{x + 20}" y="{HEIGHT - 4}">{html.escape(label)}</text>')
        x += 30 + 6 * len(label)
    out.append("</svg>")
    return "\n".join(out)
