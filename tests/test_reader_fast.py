"""The reader's fast paths (one regular expression per op pattern, per common fill and
declaration) against the general ones they stand in for: same bindings, same sentences, same
refusals, on the zoo's sentences and on variants of them."""

import glob
import os

import pytest

from emitter import ProgramError, read_tensor_sentences
from emitter.language import reader
from emitter.language.patterns import compile_pattern, match, parse_pattern
from emitter.ops import ALL_OPS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _variants(words):
    """The words, and each with one word dropped, doubled, or a flag-like word put in."""
    yield words
    for i in range(len(words)):
        yield words[:i] + words[i + 1:]
        yield words[:i + 1] + words[i:]
        yield words[:i] + ["renormalised"] + words[i:]


def _op_sentences():
    for path in sorted(glob.glob(os.path.join(ROOT, "programs", "*.logos"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                words = line.strip().rstrip(".").split()
                if words[:1] == ["Let"] and len(words) > 3 and words[3] != "a":
                    yield words[3:]
                elif words[:2] == ["Set", "row"]:
                    yield words[1:]


def test_compiled_patterns_bind_as_match_does():
    """Every op's compiled pattern gives `match`'s dict (keys in the same order) or None, for
    every zoo sentence and its variants, and for each pattern's own words with optional groups
    said and left out."""
    sentences = list(_op_sentences())
    assert len(sentences) > 1000
    compared = agreed = 0
    for op in ALL_OPS:
        items = parse_pattern(op.pattern)
        compiled = compile_pattern(items)
        own = [w for item in items for w in (item if isinstance(item, list) else [item])]
        fixed = [item for item in items if not isinstance(item, list)]
        for words in [own, fixed] + [w for s in sentences for w in _variants(s)
                                      if s[:2] == own[:2] or s[:1] == fixed[:1]]:
            expected, got = match(items, words), compiled(words)
            assert got == expected and list(got or ()) == list(expected or ()), (op.name, words)
            compared += 1
            agreed += expected is not None
    assert agreed > 500 and compared > agreed


@pytest.mark.parametrize("line", [
    "Set item 3 of t to 7.", "Set item 3 of t to -1e-3.", "Set item 3 of t to 1..",
    "Set item 0 of t to 2.", "Set  item 3 of t to 7.", "Set item 3 of __t to 7.",
    "Set item 3 of def to 7.", "Set item 3 of t to " + "1" * 65 + ".", "Set item 1234567890123456 of t to 1.",
    "Let a be a 2 by 3 tensor of Real.", "Let a be a 0 by 3 tensor of Real.",
    "Let a be a 65536 by 65536 tensor of Real.", "Let a be a 2 by 3 tensor of Int.",
    "Let class be a 2 by 3 tensor of Real.", "Let a  be a 2 by 3 tensor of Real.",
    "Let a be a 2 by 3 tensor of Float.",
])
def test_fast_fills_and_declarations_read_as_the_general_path_does(line):
    """A line the fast path takes gives the sentence the general path gives; one it leaves gets
    the general path's refusal."""
    def general():
        return reader._read_sentence(line, 1)
    try:
        expected = [general()]
    except ProgramError as e:
        with pytest.raises(ProgramError) as got:
            read_tensor_sentences(line)
        assert (got.value.message, got.value.line) == (e.message, e.line)
        return
    assert read_tensor_sentences(line) == expected
