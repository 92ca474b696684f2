"""Matching a sentence's words against an op's pattern (see `emitter.ops.base` for the notation)."""


def parse_pattern(pattern):
    """A pattern as a list of items: a word, or a list of words for an optional group."""
    items, group = [], None
    for tok in pattern.replace("[", " [ ").replace("]", " ] ").split():
        if tok == "[":
            group = []
        elif tok == "]":
            items.append(group)
            group = None
        elif group is not None:
            group.append(tok)
        else:
            items.append(tok)
    return items


def match(items, words):
    """Bind `words` to a parsed pattern: a dict placeholder -> word, or None if they do not fit.
    An optional group of literal words alone (`[renormalised]`) is a flag: said, it binds its
    words (joined by spaces) to True."""

    def go(i, j, bound):
        if i == len(items):
            return bound if j == len(words) else None
        item = items[i]
        if isinstance(item, list):
            got = go_seq(item, j, bound)
            if got is not None and not any(w[0].isupper() for w in item):
                got = got[0], {**got[1], " ".join(item): True}   # a flag: the group was said
            if got is not None:
                done = go(i + 1, got[0], got[1])
                if done is not None:
                    return done
            return go(i + 1, j, bound)
        got = go_seq([item], j, bound)
        return None if got is None else go(i + 1, got[0], got[1])

    def go_seq(seq, j, bound):
        if j + len(seq) > len(words):
            return None
        new = dict(bound)
        for k, tok in enumerate(seq):
            w = words[j + k]
            if tok[0].isupper():
                new[tok] = w
            elif w != tok:
                return None
        return j + len(seq), new

    return go(0, 0, {})


def key_of(items):
    """(position, word) of the pattern's first literal word: what names the op in a sentence."""
    for pos, item in enumerate(items):
        if isinstance(item, list):
            break
        if not item[0].isupper():
            return pos, item
    raise AssertionError("a pattern starts with a literal word within its fixed part")
