"""The nearest known word for an unknown one ("did you mean `matmul`?"): a refusal of a misspelt op,
name, key or dtype offers the closest known spelling instead of listing every one."""

from .errors import excerpt


def nearest(word, known, cutoff=0.6):
    """The known word closest to `word` (the one that differs only in case first, else difflib's
    ratio at least `cutoff`), or None."""
    known = [str(k) for k in known]
    same = [k for k in known if k.lower() == str(word).lower()]
    if same:
        return same[0]
    import difflib   # (only for a word not known: a `logos check` of a clean zoo never loads it)
    word = str(word)   # difflib's ratio is at most 2·min(len)/(sum of lengths): skip those it rules out
    known = [k for k in known if 2 * min(len(k), len(word)) >= cutoff * (len(k) + len(word))]
    found = difflib.get_close_matches(word, known, n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(word, known, cutoff=0.6):
    """`; did you mean `X`?` for the nearest known word, or "" when none is near."""
    near = nearest(word, known, cutoff)
    return f"; did you mean `{near}`?" if near else ""


def unknown(what, word, known, listed=True):
    """`` `word` is not WHAT`` with the nearest known word, else (when `listed`) the known ones."""
    near = nearest(word, known)
    head = f"`{excerpt(word, 60)}` is not {what}"
    if near:
        return f"{head}; did you mean `{near}`?"
    return f"{head} (known: {', '.join(map(str, known))})" if listed else head


def ranked(text, forms, n=3):
    """The `n` forms most like `text` (difflib's ratio), best first, ties in the given order; of a
    line, its first 256 characters (a 65 KB line of words took seconds to refuse)."""
    import difflib
    text = text[:256]
    score = lambda f: difflib.SequenceMatcher(None, text, f, autojunk=False).ratio()  # noqa: E731
    return sorted(forms, key=score, reverse=True)[:n]
