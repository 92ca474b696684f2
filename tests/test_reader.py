"""The reader: every sentence form, every refusal with its line and message."""

import pytest

from emitter import ProgramError, read_program, read_tensor_sentences
from emitter.language.program import Decl, Fill, OpSentence, Show

DECLS = """Let a be a 2 by 3 tensor of Real.
Let b be a 3 by 2 tensor of Real.
Let r be a 1 by 3 tensor of Real.
"""


def refused(source):
    with pytest.raises(ProgramError) as e:
        read_program(source)
    return e.value


def test_each_sentence_form_is_read():
    src = ("## Heading\n\nLet t be a 4 by 2 tensor of Int.\nSet item 3 of t to 7.\n"
           "Let x be a 1 by 2 tensor of Real.\nSet row 1 of t to x.\nShow t.\nLet y be row 1 of t.\n")
    s = read_tensor_sentences(src)
    assert [type(x) for x in s] == [Decl, Fill, Decl, OpSentence, Show, OpSentence]
    assert s[0] == Decl("t", 4, 2, False, 3)
    assert (s[1].var, s[1].index, s[1].value, s[1].line) == ("t", 3, "7", 4)
    assert s[3].op.name == "set row" and s[3].bound == {"P": 1, "TABLE": "t", "ROW": "x"}
    assert s[4].words == ("t",)
    assert s[5].op.name == "embedding" and s[5].bound == {"TOK": 1, "TABLE": "t"} and s[5].line == 8


@pytest.mark.parametrize("sentence,op,bound", [
    ("Let y be a matmul b.", "matmul", {"A": "a", "B": "b"}),
    ("Let y be a plus r.", "plus", {"A": "a", "B": "r"}),
    ("Let y be a hadamard a.", "hadamard", {"A": "a", "B": "a"}),
    ("Let y be rmsnorm of a.", "rmsnorm", {"X": "a"}),
    ("Let y be rmsnorm of a with weight r.", "rmsnorm", {"X": "a", "W": "r"}),
    ("Let y be rmsnorm of a plus a with weight r.", "rmsnorm", {"X": "a", "R": "a", "W": "r"}),
    ("Let y be rmsnorm of a with weight r across 2 heads.", "rmsnorm", {"X": "a", "W": "r", "H": 2}),
    ("Let y be l2norm of a across 3 heads.", "l2norm", {"X": "a", "H": 3}),
    ("Let y be sigmoid of a.", "sigmoid", {"X": "a"}),
    ("Let y be silu of a.", "silu", {"X": "a"}),
    ("Let y be gelu of a.", "gelu", {"X": "a"}),
    ("Let y be softmax of a.", "softmax", {"X": "a"}),
    ("Let y be transpose of a.", "transpose", {"X": "a"}),
    ("Let y be swiglu of a and a.", "swiglu", {"G": "a", "U": "a"}),
    ("Let y be argmax of a.", "argmax", {"X": "a"}),
    ("Let y be layernorm of a with weight r and bias r.", "layernorm", {"X": "a", "W": "r", "B": "r"}),
    ("Let y be decay of a with bias a rate a.", "decay", {"Ar": "a", "Dt": "a", "Alog": "a"}),
    ("Let y be full attention of a over a and a with 3 heads.", "full attention",
     {"Q": "a", "K": "a", "V": "a", "H": 3}),
    ("Let y be row 1 of a.", "embedding", {"TOK": 1, "TABLE": "a"}),
    ("Let y be selective scan of a.", "selective scan", {"X": "a"}),
    ("Let y be moe of a.", "moe", {"X": "a"}),
    ("Let y be softmax routing of a choosing 2.", "softmax routing", {"L": "a", "K": 2}),
    ("Let y be softmax routing of a choosing 2 renormalised.", "softmax routing",
     {"L": "a", "K": 2, "renormalised": True}),
    ("Let y be sigmoid routing of a with bias r choosing 3 in 1 of 1 groups renormalised scaled by 2.5.",
     "sigmoid routing", {"L": "a", "B": "r", "K": 3, "G": 1, "N": 1, "renormalised": True, "F": 2.5}),
    ("Let y be sigmoid routing of a choosing 1.", "sigmoid routing", {"L": "a", "K": 1}),
])
def test_op_patterns(sentence, op, bound):
    p = read_program(DECLS + sentence)
    assert p.stages[-1].op.name == op and p.stages[-1].bound == bound and p.stages[-1].line == 4


def test_rope_attention_conv_delta_patterns():
    src = """Let q be a 1 by 8 tensor of Real.
Let c be a 1 by 2 tensor of Real.
Let K be a 3 by 4 tensor of Real.
Let w be a 2 by 8 tensor of Real.
Let s be a 2 by 8 tensor of Real.
Let v be a 1 by 16 tensor of Real.
Let hb be a 1 by 4 tensor of Real.
Let S be a 4 by 16 tensor of Real.
Let g be a 1 by 4 tensor of Real.
Let r1 be rope of q with cos c and sin c.
Let r2 be rope of q with cos c and sin c across 2 heads.
Let at be attention of q over K and K with 2 heads 1 groups.
Let cv be causal conv of q with weight w state s over 2 taps.
Let gd be gated delta of q over q and v with gate v beta hb decay hb state S norm g with 4 heads 2 groups.
"""
    p = read_program(src)
    names = [(st.op.name, st.writes) for st in p.stages]
    assert names == [("rope", None), ("rope", None), ("attention", None), ("causal conv", "s"),
                     ("gated delta", "S")]
    assert p.states == ["s", "S"] and p.output == "gd" and p.shapes["gd"] == (1, 16)
    assert p.stages[1].bound["H"] == 2 and p.stages[4].bound["HV"] == 4


@pytest.mark.parametrize("source,line,needle", [
    ("Let a be a 2 by 3 tensor of Real", 1, "a sentence ends with a period"),
    ("\n\nLet a be a 2 by 3 tensor of Float.", 3, "a tensor is of Real or Int, not `Float`"),
    ("Let a be a 0 by 3 tensor of Real.", 1, "the row count must be a positive integer literal (at most 15 digits), got `0`"),
    ("Let a be a two by 3 tensor of Real.", 1, "got `two`"),
    ("Let a be a 2 by 3 matrix of Real.", 1, "expected `Let V be a R by C tensor of Real.`"),
    ("Compute everything.", 1, "not a tensor sentence: a sentence starts with `Let`, `Set` or `Show`"),
    (DECLS + "Let y be rmsnorm a.", 4, "expected `Let OUT be rmsnorm of X [plus R] [with weight W] [across H heads] [with epsilon EPS].`"),
    (DECLS + "Let y be rope of a with cos r.", 4, "expected `Let OUT be rope of Q with cos RC and sin RS"),
    (DECLS + "Let y be attention of a over b and b with 2 heads.", 4, "attention of Q over K and V with H heads KV groups"),
    (DECLS + "Let y be rmsnorm of a across x heads.", 4, "`H` in `Let OUT be rmsnorm"),
    (DECLS + "Set item 7 of a to 1.", 4, "items run 1..6"),
    (DECLS + "Set item 0 of a to 1.", 4, "items run 1..6"),
    (DECLS + "Set item 1 of a to nan.", 4, "VALUE must be a numeric literal"),
    (DECLS + "Set item 1 of a to 1e999.", 4, "is not a finite number"),
    ("Let t be a 1 by 2 tensor of Int.\nSet item 1 of t to 0.5.", 2, "an Int tensor and takes an integer"),
    (DECLS + "Set item 1 of q to 1.", 4, "not declared on an earlier line"),
    (DECLS + "Let y be silu of a.\nSet item 1 of y to 1.", 5, "computes; only a declared tensor is filled"),
    (DECLS + "Let y be silu of a.\nSet item 1 of a to 1.", 5, "filled after the op on line 4 read it"),
    (DECLS + "Let a be silu of b.", 4, "`a` is bound here and already on line 1"),
    (DECLS + "Let b be a 1 by 1 tensor of Real.", 4, "`b` is bound here and already on line 2"),
    (DECLS + "Let y be silu of nope.", 4, "reads `nope`, which is not bound on an earlier line"),
    (DECLS + "Let y be a matmul a.", 4, "inner dimensions disagree"),
    (DECLS + "Let y be a plus b.", 4, "to broadcast over its rows"),
    (DECLS + "Let y be swiglu of a and b.", 4, "must have the same shape"),
    (DECLS + "Let y be rmsnorm of a plus a.", 4, "carries a weight"),
    (DECLS + "Let y be rmsnorm of a with weight b.", 4, "must hold 3 values"),
    (DECLS + "Let y be rmsnorm of a across 4 heads.", 4, "4 does not divide 6"),
    (DECLS + "Let y be layernorm of a with weight b and bias r.", 4, "must hold 3 values"),
    (DECLS + "Let y be decay of a with bias b rate a.", 4, "must have the same shape"),
    (DECLS + "Let y be row 2 of a.", 4, "row 2 is outside `a`, which has 2 rows"),
    (DECLS + "Let y be row a of b.", 4, "the row index `a` must be 1 by 1"),
    (DECLS + "Let y be row -1 of a.", 4, "the row index `-1` is no row number: a whole number from 0"),
    (DECLS + "Let y be row " + "9" * 20 + " of a.", 4, "is no row number: a whole number from 0 (of at most 15"),
    (DECLS + "Let b be a 1 by 1 tensor of Int.", 4,
     "`Let b be a 1 by 1 tensor of Int.`: `b` is bound here and already on line 2"),
    ("Let x be a 1 by 2 tensor of Real.\nLet A be a 3 by 2 tensor of Real.\nLet y be x plus A.", 3,
     "`A` is 3 by 2: it must be 1 by 2 like `x`"),
    (DECLS + "Set row 0 of a to b.", 4, "must be 1 by 3"),
    (DECLS + "Let y be silu of r.\nSet row 0 of y to r.", 5, "only a declared tensor carries state"),
    (DECLS + "Let y be rope of r with cos r and sin r across 1 heads.", 4, "more than half a head"),
    (DECLS + "Let y be rope of r with cos r and sin r.", 4, "rotates 2·half = 6 values at a time"),
    (DECLS + "Let y be attention of r over a and a with 3 heads 2 groups.", 4, "3 heads in 2 KV groups"),
    (DECLS + "Let y be full attention of a over b and a with 1 heads.", 4, "must have the same shape"),
    (DECLS + "Let y be causal conv of r with weight a state a over 3 taps.", 4, "must be 3 taps by 3"),
    (DECLS, None, "a tensor program with no op has nothing to compute"),
    ("Let s be a 2 by 3 tensor of Real.\nLet x be a 1 by 3 tensor of Real.\n"
     "Let s be causal conv of x with weight s state s over 2 taps.", 3, "`s` is bound here and already on line 1"),
    ("Let a be a " + "9" * 5000 + " by 3 tensor of Real.", 1, "at most 15 digits"),
    (DECLS + "Set item " + "1" * 5000 + " of a to 1.", 4, "at most 15 digits"),
    ("Let t be a 1 by 2 tensor of Int.\nSet item 1 of t to " + "9" * 400 + ".", 2, "VALUE must be a numeric literal"),
    ("Let t be a 1 by 2 tensor of Int.\nSet item 1 of t to 9007199254740993.", 2, "at most 2^53"),
    ("Let t be a 1 by 2 tensor of Int.\nSet item 1 of t to 2.0.", 2, "takes an integer written in digits (`-3`, `42`"),
    (DECLS + "Let y be rmsnorm of a across " + "3" * 5000 + " heads.", 4, "at most 15 digits"),
])
def test_refusals(source, line, needle):
    e = refused(source)
    assert e.line == line
    assert needle in e.message, e.message


def test_error_quotes_the_sentence_and_names_path():
    e = refused(DECLS + "Let y be rmsnorm a.")
    assert e.message.startswith("`Let y be rmsnorm a.`: expected")
    with pytest.raises(ProgramError) as e2:
        read_program(DECLS + "Let y be rmsnorm a.", path="zoo/p.logos")
    assert str(e2.value).startswith("zoo/p.logos:4: `Let y be rmsnorm a.`")


@pytest.mark.parametrize("name", ["a;import", "__import__", "self", "torch", "F", "np", "class",
                                  "import", "match", "_", "lambda", "print", "rmsnorm", "LEAVES",
                                  "inputs", "__x", "1a", "a-b", "é", "EPS", "LogosModule"])
def test_unsafe_names_refused_everywhere(name):
    for src in (f"Let {name} be a 1 by 2 tensor of Real.",
                f"Let a be a 1 by 2 tensor of Real.\nLet {name} be silu of a.",
                f"Let a be a 1 by 2 tensor of Real.\nLet y be silu of {name}."):
        e = refused(src)
        assert f"`{name}`" in e.message


def test_a_name_too_long_for_its_weights_file_is_refused_at_its_line():
    """A leaf's weights file is named after it (`<name>.f32`): a name past 128 characters is
    refused where it is declared or bound, and one of 128 is a name."""
    long = "w" * 129
    for src, line in ((f"Let {long} be a 1 by 2 tensor of Real.\nLet y be silu of {long}.", 1),
                      (f"Let a be a 1 by 2 tensor of Real.\nLet {long} be silu of a.", 2)):
        e = refused(src)
        assert e.line == line and "129 characters long, past 128" in e.message, e.message
    assert read_program(f"Let {'w' * 128} be a 1 by 2 tensor of Real.\nLet y be silu of {'w' * 128}.\n").output == "y"


def test_set_row_writes_back_and_output_skips_it():
    p = read_program("Let t be a 3 by 2 tensor of Real.\nLet r be a 1 by 2 tensor of Real.\n"
                     "Let y be silu of r.\nSet row 2 of t to y.\n")
    assert p.output == "y" and p.states == ["t"] and p.stages[-1].writes == "t"
    assert not p.stages[-1].binds


def test_an_int_result_only_where_integers_stay_integers():
    # Real where the first input is (docs/SUGAR.md); Int tensors hold integers, so an op of an Int
    # tensor that makes non-integers (sigmoid, a product with a Real) is Real too
    p = read_program("Let t be a 1 by 2 tensor of Int.\nLet r be a 1 by 2 tensor of Real.\n"
                     "Let T be a 3 by 2 tensor of Int.\nLet i be a 1 by 1 tensor of Int.\n"
                     "Let a be t plus r.\nLet b be r plus t.\nLet c be t plus t.\nLet d be sigmoid of t.\n"
                     "Let e be t hadamard r.\nLet f be row i of T.\nLet g be argmax of r.\nLet h be row g of T.\n"
                     "Let k be argmax of t.\nLet m be transpose of t.\nLet n be t matmul m.\nLet o be softmax of c.\n")
    assert {v: p.real[v] for v in "abcdefghkmno"} == {
        "a": True, "b": True, "c": False, "d": True, "e": True, "f": False, "g": True, "h": False,
        "k": False, "m": False, "n": False, "o": True}


def test_crlf_and_headings():
    p = read_program("# title\r\n\r\nLet a be a 1 by 2 tensor of Real.\r\nLet y be silu of a.\r\n")
    assert p.stages[0].line == 4
