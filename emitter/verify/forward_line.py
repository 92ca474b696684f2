"""Where in a bundle's forward an exception was raised, read from the forward's own source: the
stage a free pass (no hook counting the taps) raised in."""

import re


def stage_raised_in(e, model):
    """The stage whose statement of the module's forward (or of a method of the bundle's it
    handed the work to) was running when `e` was raised: read from that line, its
    `self.tap(N, …)`, else the `# stage N:` comment above it in its function; None where no
    frame of model.py says (no hook counts the stages tapped)."""
    code = getattr(getattr(type(model), "forward", None), "__code__", None)
    path, tb, lines = getattr(code, "co_filename", None), e.__traceback__, []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            lines.append(tb.tb_lineno)
        tb = tb.tb_next
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read().splitlines() if lines else []
    except (OSError, UnicodeDecodeError, TypeError):
        return None
    for line in reversed(lines):   # the innermost frame of model.py that names its stage
        found = re.search(r"self\.tap\((\d+)\s*,", source[line - 1]) if 0 < line <= len(source) else None
        for text in reversed(source[:line - 1] if found is None else ()):
            found = re.match(r"\s*# stage (\d+):", text)
            if found or text.strip().startswith("def "):
                break
        if found:
            return int(found.group(1))
    return None
