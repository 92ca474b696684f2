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


# names: any text in a name slot is a safe identifier in model.py, or a ProgramError naming it
NAME_CHARS = st.characters(codec="utf-8") | st.sampled_from(list("_;.()[]'\"\\\n\r\t\x00\x01\u2028é"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(NAME_CHARS, min_size=1, max_size=30))
def test_any_name(name):
    src = f"Let {name} be a 1 by 2 tensor of Real.\nSet item 1 of {name} to 1.\nLet y be silu of {name}.\n"
    try:
        art = emit_program(read_program(src))
    except ProgramError as e:
        assert e.line is not None and len(str(e)) < 5000
        return
    compile(art.model_py, "model.py", "exec")     # whatever passed is valid Python
    word = name.split()[0]                        # white space around a name is a word break
    assert f"self.leaf_{word} " in art.model_py and word.isidentifier() and word.isascii()


# encodings and sizes: any bytes in a program file, any line endings, any length of number
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.sampled_from([b"\n", b"\r\n", b"\r"]), st.booleans())
def test_any_bytes_in_a_file(tmp_path_factory, data, newline, bom):
    from emitter import read_file
    path = tmp_path_factory.mktemp("fuzz") / "p.logos"
    body = b"Let x be a 1 by 2 tensor of Real." + newline + data + newline + b"Let y be silu of x." + newline
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body)
    try:
        read_file(str(path))
    except ProgramError as e:
        assert e.path == str(path) and (e.line is None or 1 <= e.line <= body.count(newline) + 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text("0123456789", min_size=1, max_size=5000), st.sampled_from(["rows", "fill", "index", "heads"]))
def test_any_size_of_number(n, where):
    text = {"rows": f"Let x be a {n} by 2 tensor of Real.\nLet y be silu of x.\n",
            "fill": f"Let x be a 1 by 2 tensor of Int.\nSet item 1 of x to {n}.\nLet y be silu of x.\n",
            "index": f"Let x be a 3 by 2 tensor of Real.\nSet item {n} of x to 1.\nLet y be row {n} of x.\n",
            "heads": f"Let x be a 1 by 4 tensor of Real.\nSet item 1 of x to 1.\nLet y be rmsnorm of x across {n} heads.\n"}[where]
    try:
        emit_program(read_program(text))
    except ProgramError as e:
        assert e.line is not None and len(str(e)) <= 4000
