"""No input text makes the reader or the emitter raise anything but ProgramError."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emitter import ProgramError, emit_program, read_program
from emitter.ops import ALL_OPS, pattern_words

WORDS = sorted({w for op in ALL_OPS for w in pattern_words(op.pattern) if not w[0].isupper()}
               | {"Let", "be", "a", "by", "tensor", "of", "Real", "Int", "Set", "item", "row", "to",
                  "Show", "x", "y", "W", "K", "0", "1", "2", "3", "4", "-1", "1e-3", "99999999999",
                  "#", ".", "heads", "groups", "taps", "self", "a;b", "__x"})

sentence = st.lists(st.sampled_from(WORDS), min_size=0, max_size=14).map(lambda ws: " ".join(ws) + ".")
program = st.lists(st.one_of(sentence, st.text(max_size=40)), max_size=12).map("\n".join)

DECLS = ("Let x be a 2 by 4 tensor of Real.\nLet y be a 4 by 4 tensor of Real.\n"
         "Let W be a 1 by 4 tensor of Real.\nLet K be a 3 by 4 tensor of Real.\n")


def _read_and_emit(src):
    try:
        emit_program(read_program(src))
    except ProgramError as e:
        assert e.line is None or e.line >= 1
        assert str(e)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_arbitrary_text(src):
    _read_and_emit(src)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program)
def test_sentences_of_sugar_words(src):
    _read_and_emit(src)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(sentence, min_size=1, max_size=6).map("\n".join))
def test_ops_over_declared_tensors(src):
    _read_and_emit(DECLS + src)
