"""The reader: LOGOS tensor sugar to the Program IR, refusing every ill-formed or ill-shaped line."""

import math
import os
import re
import stat

from .errors import ProgramError, excerpt
from .hints import did_you_mean, nearest, ranked
from .lines import program_lines
from .names import layer_of, unsafe_name
from ..ops import OPS, SET_ROW, Args, ShapeError
from .patterns import compile_pattern, key_of, parse_pattern
from .program import Decl, Fill, OpSentence, Program, Show, Stage

MAX_ELEMENTS = 1 << 31
MAX_LINE = 1 << 16          # characters in one line
MAX_PROGRAM_BYTES = 64 << 20
MAX_INT = 1 << 53  # an Int fill must survive float64 (the VM's and the module's number type)
_UINT = re.compile(r"[0-9]{1,15}")  # counts and indices: well past any shape, far from int()'s limits
_INT = re.compile(r"[+-]?[0-9]{1,16}")
_REAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
# a real literal in a pattern slot (an epsilon): unsigned; a point, if any, has digits on both sides
_POSITIVE_REAL = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?")

DECL_FORM = "Let V be a R by C tensor of Real."
FILL_FORM = "Set item N of V to VALUE."
_PATTERNS = [(op, parse_pattern(op.pattern)) for op in OPS]
_KEYS = [(op, items, key_of(items)) for op, items in _PATTERNS]
_SET_ROW_MATCH = compile_pattern(parse_pattern(SET_ROW.pattern))
# (position, word) of an op's naming word -> [(its place in _KEYS, op, matcher)]: a sentence's
# candidate ops are looked up by the words at those positions, not found by trying every op
_BY_KEY = {}
for _i, (_op, _items, _key) in enumerate(_KEYS):
    _BY_KEY.setdefault(_key, []).append((_i, _op, compile_pattern(_items)))
_KEY_POSITIONS = sorted({pos for pos, _ in _BY_KEY})
# The common well-formed fill and declaration, read in one regular expression each; anything else
# (and any value these leave to the checks below) takes the sentence-by-sentence path, which says
# what is wrong. A declaration is read so only if no op is named by a word it has in that place.
_FAST_FILL = re.compile(r"Set item ([0-9]{1,15}) of ([A-Za-z_][A-Za-z0-9_]*) to "
                        r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\.")
_FAST_DECL = re.compile(r"Let ([A-Za-z_][A-Za-z0-9_]*) be a ([0-9]{1,15}) by ([0-9]{1,15}) "
                        r"tensor of (Real|Int)\.")
_DECL_FAST = not any(word in ("a", "by", "tensor", "of") or word.isdigit() for pos, word in _BY_KEY)


def _form(op):
    return f"Set {op.pattern}." if op is SET_ROW else f"Let OUT be {op.pattern}."


# every sentence form, as `logos check --forms` lists them (a wheel's user has no docs/SUGAR.md);
# one the reader knows but no torch call spells is marked so, and never offered as a hint
FORMS = [DECL_FORM, FILL_FORM, _form(SET_ROW)] + [
    _form(op) + ("   (read, then refused: no torch spelling)" if op.call is None else "")
    for op, _ in _PATTERNS] + ["Show WORDS."]
_OP_WORDS = {}   # an op's naming word (`matmul`, `rmsnorm`, `row`) -> its ops
for _op, _items, (_pos, _word) in _KEYS:
    _OP_WORDS.setdefault(_word, []).append(_op)
MAX_HINT = 240   # an unknown sentence's message (its path aside): the nearest forms, never all


def _hint(line, head, forms, close=""):
    """`` `sentence`: HEAD `form`; …CLOSE``: as many of `forms` (at most three) as keep the message
    under MAX_HINT characters, the sentence quoted shorter where it is long."""
    quoted = excerpt(line.text, 60)
    text = lambda shown: f"`{quoted}`: {head}" + "; ".join(f"`{f}`" for f in shown) + close  # noqa: E731
    shown = []
    for form in forms[:3]:
        if len(text(shown + [form])) > MAX_HINT:
            break
        shown.append(form)
    return ProgramError(text(shown), line.number)


def _unknown_let(line, rest):
    """An op sentence whose op the reader does not know: the nearest op word of the sentence's
    words (a misspelt `matmull`), else the forms most like it."""
    import difflib
    best = None
    for word in rest[:max(pos for _, _, (pos, _) in _KEYS) + 1]:   # where an op's word stands
        near = nearest(word, _OP_WORDS, 0.7)
        if near and word != near:
            score = difflib.SequenceMatcher(None, word, near).ratio()
            if best is None or score > best[0]:
                best = (score, word, near)
    if best:
        _, word, near = best
        return _hint(line, f"`{excerpt(word, 40)}` is no op; did you mean `{near}`, as in ",
                     [_form(op) for op in _OP_WORDS[near]], "?")
    bodies = {"a R by C tensor of Real": DECL_FORM, **{op.pattern: _form(op) for op, _ in _PATTERNS
                                                        if op.call is not None}}
    return _hint(line, "no op the reader knows; the nearest forms: ",
                 [bodies[b] for b in ranked(" ".join(rest), list(bodies))])


def _unknown_start(line, words):
    """A sentence that starts with no known word: `Let`, `Set` or `Show`, the nearest named."""
    if words[0] == "Let":
        return line.error("expected `Let NAME be …`: a declaration (`" + DECL_FORM + "`) or an op")
    near = nearest(words[0], ("Let", "Set", "Show"), 0.5)
    head = "not a tensor sentence: a sentence starts with `Let`, `Set` or `Show`"
    return ProgramError(f"`{excerpt(line.text, 60)}`: {head}"
                        + (f"; did you mean `{near}`?" if near else " (every form: `logos check --forms`)"),
                        line.number)


class _Line:
    """One line's text (a bounded excerpt, for errors that quote the sentence) and number."""

    def __init__(self, text, number):
        self.text, self.number = excerpt(text), number

    def error(self, message):
        return ProgramError(f"`{self.text}`: {message}", self.number)

    def expected(self, form, detail=""):
        return self.error(f"expected `{form}`" + (f" ({detail})" if detail else ""))


def _name(line, word, what="a tensor name"):
    why = unsafe_name(word)
    if why:
        raise line.error(f"{what} `{excerpt(word, 40)}` {why}")
    return word


def _count(line, word, what):
    if not _UINT.fullmatch(word) or int(word) == 0:
        raise line.error(f"{what} must be a positive integer literal (at most 15 digits), got "
                         f"`{excerpt(word, 40)}`")
    return int(word)


def _positive_real(line, word, what):
    value = float(word) if _POSITIVE_REAL.fullmatch(word) else 0.0
    if not 0.0 < value < math.inf:
        raise line.error(f"{what} must be a positive finite number written like `1e-5`, `0.00001` or "
                         f"`1.0e-12`, got `{excerpt(word, 40)}`")
    return value


def _bind(line, op, bound):
    """Check and convert a matched op's placeholder words: integers, reals, indices and safe names."""
    out = {}
    for p, w in bound.items():
        if w is True:   # a flag (patterns.match)
            out[p] = True
        elif p in op.ints:
            out[p] = _count(line, w, f"`{p}` in `{_form(op)}`")
        elif p in op.reals:
            out[p] = _positive_real(line, w, f"`{p}` in `{_form(op)}`")
        elif p in op.index:
            out[p] = int(w) if _UINT.fullmatch(w) else _row_index(line, w)
        else:
            out[p] = _name(line, w)
    return out


def _row_index(line, w):
    """A row index that is no whole number up to 15 digits: a tensor's name, or said as expected."""
    if re.fullmatch(r"[-+]?[0-9][0-9.eE+-]*", w):
        raise line.error(f"the row index `{excerpt(w, 40)}` is no row number: a whole number from 0 "
                         "(of at most 15 digits, inside the table) or a 1 by 1 tensor's name")
    return _name(line, w, "the row index")


def _op_sentence(line, out, op, bound):
    return OpSentence(out, op, _bind(line, op, bound), line.number, line.text)


def _read_let(line, words):
    out = _name(line, words[1], "the bound name")
    rest = words[3:]
    found = [_BY_KEY.get((pos, rest[pos]), ()) for pos in _KEY_POSITIONS if pos < len(rest)]
    candidates = found[0] if len(found) == 1 else sorted(c for cs in found for c in cs)
    for _, op, matcher in candidates:
        bound = matcher(rest)
        if bound is not None:
            return _op_sentence(line, out, op, bound)
    if candidates:
        # ops that share their first word (`softmax`, `softmax routing`): each form is quoted
        raise line.error("expected " + " or ".join(f"`{_form(op)}`" for _, op, _ in candidates))
    if rest and rest[0] == "a":
        if not (len(rest) == 7 and rest[2] == "by" and rest[4] == "tensor" and rest[5] == "of"):
            raise line.expected(DECL_FORM, "or `… of Int.`")
        if rest[6] not in ("Real", "Int"):
            raise line.error(f"a tensor is of Real or Int, not `{excerpt(rest[6], 40)}`"
                             + did_you_mean(rest[6], ("Real", "Int")))
        rows, cols = _count(line, rest[1], "the row count"), _count(line, rest[3], "the column count")
        if rows * cols > MAX_ELEMENTS:
            raise line.error(f"{rows} by {cols} is more than {MAX_ELEMENTS} elements")
        return Decl(out, rows, cols, rest[6] == "Real", line.number)
    raise _unknown_let(line, rest)


def _read_set(line, words):
    if len(words) > 1 and words[1] == "item":
        if not (len(words) == 7 and words[3] == "of" and words[5] == "to"):
            raise line.expected(FILL_FORM)
        if not _UINT.fullmatch(words[2]):
            raise line.error(f"the item number must be an integer literal (at most 15 digits), "
                             f"got `{excerpt(words[2], 40)}`")
        if len(words[6]) > 64 or not _REAL.fullmatch(words[6]):
            raise line.error(f"VALUE must be a numeric literal (`3`, `-0.25`, `1e-3`), got `{excerpt(words[6], 40)}`")
        return Fill(_name(line, words[4]), int(words[2]), words[6], line.number)
    if len(words) > 1 and words[1] == "row":
        bound = _SET_ROW_MATCH(words[1:])
        if bound is None:
            raise line.expected(_form(SET_ROW))
        return _op_sentence(line, bound["TABLE"], SET_ROW, bound)
    raise line.error(f"expected `{FILL_FORM}` or `{_form(SET_ROW)}`")


def _read_sentence(text, number):
    t = text.strip()
    if not t or t.startswith("#"):
        return None
    line = _Line(t, number)
    if not t.endswith("."):
        raise line.error("a sentence ends with a period")
    words = t[:-1].split()
    if not words:
        raise line.error("an empty sentence")
    if words[0] == "Show":
        return Show(tuple(words[1:]), number)
    if words[0] == "Set":
        return _read_set(line, words)
    if words[0] == "Let" and len(words) >= 4 and words[2] == "be":
        return _read_let(line, words)
    raise _unknown_start(line, words)


def read_tensor_sentences(source):
    """Every sentence of a program in order (Decl, Fill, OpSentence, Show); no binding checks.

    Lines end with LF, CRLF or a bare CR, as editors count them (and the line numbers of errors
    with them); a UTF-8 byte-order mark at the start is not text."""
    out = []
    for number, text in program_lines(source):
        if len(text) > MAX_LINE:
            raise ProgramError(f"`{excerpt(text)}`: a line of {len(text)} characters; a line holds at "
                               f"most {MAX_LINE}", number)
        t = text.strip()
        m = _FAST_FILL.fullmatch(t) if t.startswith("Set item") else None
        if m is not None and len(m[3]) <= 64 and unsafe_name(m[2]) is None:
            out.append(Fill(m[2], int(m[1]), m[3], number))
            continue
        m = _FAST_DECL.fullmatch(t) if _DECL_FAST and t.startswith("Let") else None
        if m is not None and unsafe_name(m[1]) is None:
            rows, cols = int(m[2]), int(m[3])
            if rows and cols and rows * cols <= MAX_ELEMENTS:
                out.append(Decl(m[1], rows, cols, m[4] == "Real", number))
                continue
        s = _read_sentence(text, number)
        if s is not None:
            out.append(s)
    return out


class _Checker:
    """Binding, fill and shape checks over the sentences, building the Program."""

    def __init__(self):
        self.shapes, self.real, self.decls, self.fills = {}, {}, {}, {}
        self.bound_at, self.read_at, self.stages, self.written = {}, {}, [], set()

    def bind(self, s, name, shape, real):
        if name in self.bound_at:
            text = getattr(s, "text", None) or \
                f"Let {s.var} be a {s.rows} by {s.cols} tensor of {'Real' if s.real else 'Int'}."
            raise ProgramError(f"`{text}`: `{name}` is bound here and already on line "
                               f"{self.bound_at[name]}; a name is bound once", s.line)
        self.bound_at[name], self.shapes[name], self.real[name] = s.line, shape, real

    def decl(self, s):
        self.bind(s, s.var, (s.rows, s.cols), s.real)
        self.decls[s.var] = s
        self.fills[s.var] = []

    def fill(self, s):
        if s.var not in self.decls:
            if s.var in self.bound_at:
                raise ProgramError(f"`Set item … of {s.var}` fills a tensor the op on line "
                                   f"{self.bound_at[s.var]} computes; only a declared tensor is filled",
                                   s.line)
            raise ProgramError(f"`Set item … of {s.var}` fills `{s.var}`, which is not declared on an "
                               "earlier line" + did_you_mean(s.var, self.decls), s.line)
        if s.var in self.read_at:
            raise ProgramError(f"`{s.var}` is filled after the op on line {self.read_at[s.var]} read it; "
                               "fills come before the first read", s.line)
        d = self.decls[s.var]
        if not 1 <= s.index <= d.rows * d.cols:
            raise ProgramError(f"`Set item {s.index} of {s.var}`: `{s.var}` is {d.rows} by {d.cols}, "
                               f"so items run 1..{d.rows * d.cols}", s.line)
        if d.real:
            value = float(s.value)
            if not math.isfinite(value):
                raise ProgramError(f"`Set item {s.index} of {s.var}`: `{s.value}` is not a finite number",
                                   s.line)
        elif _INT.fullmatch(s.value) and abs(int(s.value)) <= MAX_INT:
            value = int(s.value)
        else:
            raise ProgramError(f"`Set item {s.index} of {s.var}`: `{s.var}` is an Int tensor and takes "
                               f"an integer written in digits (`-3`, `42`; at most 2^53), not `{excerpt(s.value, 40)}`",
                               s.line)
        self.fills[s.var].append((s.index - 1, value))

    def op(self, s):
        err = lambda message: ProgramError(f"`{s.text}`: {message}", s.line)  # noqa: E731
        inputs = s.op.tensor_inputs(s.bound)
        for name in inputs:
            if name not in self.bound_at:
                raise err(f"`{s.op.name}` reads `{name}`, which is not bound on an earlier line"
                          + did_you_mean(name, self.bound_at))
        try:
            shape = s.op.shape(Args(s.bound, self.shapes))
        except ShapeError as e:
            raise err(str(e)) from None
        writes = s.bound[s.op.writes] if s.op.writes else None
        if writes is not None and writes not in self.decls:
            raise err(f"`{writes}` is computed on line {self.bound_at[writes]}; only a declared "
                      "tensor carries state")
        for name in inputs:
            self.read_at.setdefault(name, s.line)
        if s.op is not SET_ROW:  # `Let S be … state S …` rebinds S: refused like any rebinding
            self.bind(s, s.out, tuple(shape), s.op.result_real(s.bound, self.real))
        if writes is not None:
            self.written.add(writes)
        self.stages.append(Stage(len(self.stages), s.out, s.op, s.bound, s.line, s.text, inputs,
                                 writes))


def _roles(c):
    """Each leaf's role, from how the program uses it: a state is written back by an op; an input
    is read as data by some op (the row index of a table, the X of a matmul); a weight is read only
    in parameter slots (a matmul's B, a norm's weight, a table) or not at all. A view (`transpose
    of E`) read only in parameter slots is a parameter too: a tied output projection `E`
    transposed keeps `E` a weight; the row index of one (`row pos of COS`) is data still."""
    data = set()
    for st in reversed(c.stages):   # every reader of a name comes after the stage that binds it
        if not (st.op.view and st.binds and st.out not in data):
            data.update(st.op.data_inputs(st.bound))
        else:   # (the row a view selects is data whatever reads the view: `row pos of COS` into rope)
            data.update(st.bound[p] for p in st.op.index if isinstance(st.bound.get(p), str))
    return {v: "state" if v in c.written else "input" if v in data else "weight" for v in c.decls}


def read_program(source, path=None):
    """The Program IR of a tensor program's text, or a ProgramError at the offending line."""
    try:
        sentences = read_tensor_sentences(source)
        c = _Checker()
        for s in sentences:
            if isinstance(s, Decl):
                c.decl(s)
            elif isinstance(s, Fill):
                c.fill(s)
            elif isinstance(s, OpSentence):
                c.op(s)
        outputs = [st.out for st in c.stages if st.binds]
        if not outputs:
            raise ProgramError("a tensor program with no op has nothing to compute")
    except ProgramError as e:
        raise e.at(path) if path is not None else e
    attention_layers = frozenset(
        layer_of(st.bound["Q"]) for st in c.stages
        if st.op.name == "attention" and layer_of(st.bound["Q"]) is not None)
    return Program(
        source=source, sentences=sentences, shapes=c.shapes, real=c.real, decls=c.decls,
        fills=c.fills, stages=c.stages, output=outputs[-1],
        states=[v for v in c.decls if v in c.written], roles=_roles(c),
        attention_layers=attention_layers,
        path=None if path is None else str(path), bound_at=c.bound_at)


def read_file(path, max_bytes=MAX_PROGRAM_BYTES):
    """Read a program file (UTF-8, at most `max_bytes`); an unreadable, undecodable or larger file
    is a ProgramError too (naming the line of the first byte that is not UTF-8)."""
    try:   # (O_NONBLOCK: a FIFO is opened without waiting for a writer, then refused)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ProgramError(f"cannot read the program: {e.strerror or e}", path=str(path)) from None
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):   # (before fdopen: it refuses a folder, naming the descriptor)
        os.close(fd)
        raise ProgramError("cannot read the program: " + (
            "it is a folder" if stat.S_ISDIR(kind) else "it is not a regular file"), path=str(path))
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise ProgramError(f"cannot read the program: {e.strerror or e}", path=str(path)) from None
    if len(data) > max_bytes:
        raise ProgramError(f"the program is over {max_bytes} bytes (limits.program_bytes raises the "
                           "limit)", path=str(path))
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProgramError(f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}",
                           data.count(b"\n", 0, e.start) + 1, str(path)) from None
    return read_program(source, path)
