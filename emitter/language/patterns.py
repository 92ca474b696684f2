"""Matching a sentence's words against an op's pattern (see `emitter.ops.base` for the notation)."""

import re


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


def _is_flag(item):
    return isinstance(item, list) and not any(w[0].isupper() for w in item)


def compile_pattern(items):
    """`match(items, words)` as one regular expression, for the reader's hot loop: a function of
    `words` giving the same dict (same keys, same order) or None. The words are joined with a
    space after each; a literal word matches itself, a placeholder one word, an optional group is
    tried first and then left out (as `match` backtracks), and a flag's group binds True."""
    parts, slots = [], []   # slots: (group index, key, is a flag), in the order `match` binds them

    def word(tok):
        if tok[0].isupper():
            slots.append((len(slots), tok, False))
            return "([^ ]+) "
        return re.escape(tok) + " "

    for item in items:
        if _is_flag(item):
            slots.append((len(slots), " ".join(item), True))
            parts.append("(" + "".join(word(tok) for tok in item) + ")?")
        elif isinstance(item, list):
            parts.append("(?:" + "".join(word(tok) for tok in item) + ")?")
        else:
            parts.append(word(item))
    source, compiled = "".join(parts), []   # compiled on first use: most ops are not in a program

    def matcher(words):
        if not compiled:
            compiled.append(re.compile(source))
        m = compiled[0].fullmatch(" ".join(words) + " " if words else "")
        if m is None:
            return None
        groups, bound = m.groups(), {}
        for index, key, flag in slots:
            value = groups[index]
            if value is not None:
                bound[key] = True if flag else value
        return bound
    return matcher
