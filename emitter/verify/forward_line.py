"""Where in a bundle's forward an exception was raised, read from the forward's own source: the
stage a free pass (no hook counting the taps) raised in."""

import re


def stage_raised_in(e, model):
    """The stage whose statement of the module's forward was running when `e` was raised (read
    from the forward's line: its `self.tap(N, …)`, else the `# stage N:` comment above it), or
    None: where no hook counts the stages tapped."""
    code = getattr(getattr(type(model), "forward", None), "__code__", None)
    tb, line = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    try:
        with open(code.co_filename, encoding="utf-8") as f:
            lines = f.read().splitlines()[:line] if line else []
    except (OSError, UnicodeDecodeError, AttributeError):
        return None
    found = re.search(r"self\.tap\((\d+)\s*,", lines[-1]) if lines else None
    for text in reversed(lines[:-1] if found is None else ()):
        found = re.match(r"\s*# stage (\d+):", text)
        if found or text.strip().startswith("def "):
            break
    return int(found.group(1)) if found else None
