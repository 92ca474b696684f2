"""The importers' GGUF reader (emitter/importers/gguf_reader.py) against gguf-py's own GGUFReader, on
files gguf-py's GGUFWriter writes: every metadata type, arrays of each, either byte order, plain and
quantised tensors; and a damaged file is a ValueError wherever it is cut or garbled, never another
exception (open_gguf turns a ValueError into the import's error naming the file)."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")   # the import extra: setup.sh installs it

from emitter.importers.gguf_reader import GGUFFile  # noqa: E402
from emitter.importers.gguf_file import open_gguf, tensor_array  # noqa: E402
from emitter.language.errors import ProgramError  # noqa: E402


def write(path, endian=gguf.GGUFEndian.LITTLE, vocab=300):
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 2 ** 63 + 5)
    w.add_int64("t.i64", -(2 ** 62))
    w.add_float64("t.f64", 1 / 3)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁wörld")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.empty", [])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_token_list([f"▁tok{i}" if i % 7 else "" for i in range(vocab)])
    w.add_token_scores([float(i) / 3 for i in range(vocab)])
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((4, 2)).astype(np.float16))
    w.add_tensor("one", np.array([7.0], np.float32))
    q = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(q, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_the_reader_reads_what_gguf_py_reads(tmp_path, endian):
    path = write(tmp_path / "m.gguf", endian)
    ref, mine = gguf.GGUFReader(path), GGUFFile(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert keys == list(mine.fields) and "t.nested" in keys
    assert mine.fields["t.nested"].contents() == [[1, 2], [3]]   # nested, where gguf-py flattens it
    for k in keys:
        a, b = ref.fields[k].contents(), mine.fields[k].contents()
        b = [x for part in b for x in part] if k == "t.nested" else b
        assert a == b and type(a) is type(b), k
        if isinstance(a, list) and a:
            assert [type(x) for x in a] == [type(x) for x in b], k
    assert mine.fields["t.str"].contents() == "héllo ▁wörld" and mine.fields["t.u64"].contents() == 2 ** 63 + 5
    assert mine.fields["t.f32"].contents() == float(np.float32(1e-5))
    assert [t.name for t in mine.tensors] == [t.name for t in ref.tensors] == ["f32", "f16", "one", "q8"]
    for a, b in zip(ref.tensors, mine.tensors):
        assert (a.tensor_type, list(a.shape), a.n_elements, a.n_bytes, a.data_offset) == \
               (b.tensor_type, list(b.shape), b.n_elements, b.n_bytes, b.data_offset), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
        if endian == gguf.GGUFEndian.LITTLE:   # (gguf-py dequantises little-endian blocks only)
            assert np.array_equal(tensor_array(a), tensor_array(b)), a.name


def test_a_damaged_gguf_is_a_value_error_wherever_it_is_cut_or_garbled(tmp_path):
    good = open(write(tmp_path / "m.gguf", vocab=20), "rb").read()
    GGUFFile(str(tmp_path / "m.gguf"))
    bad = tmp_path / "bad.gguf"
    rng = np.random.default_rng(0)
    cases = [good[:n] for n in range(0, len(good), 7)]
    for _ in range(300):   # a garbled byte or eight anywhere in the header and the metadata
        b = bytearray(good)
        for at in rng.integers(0, 700, 8):
            b[at] = int(rng.integers(0, 256))
        cases.append(bytes(b))
    cases.append(good[:8] + (2 ** 60).to_bytes(8, "little") + good[16:])   # a tensor count past the file
    refused = 0
    for data in cases:
        bad.write_bytes(data)
        try:
            GGUFFile(str(bad))
        except ValueError:
            refused += 1
    assert refused > len(range(0, len(good), 7)) - 2   # a cut file is refused (all but whole ones)
    bad.write_bytes(good[:100])
    with pytest.raises(ProgramError) as e:
        open_gguf(str(bad))
    assert str(e.value) == f"{bad}: cannot read the GGUF file: 19 metadata entries do not fit in its 100 bytes"


def test_duplicate_keys_and_a_bad_alignment_are_refused(tmp_path):
    path = write(tmp_path / "m.gguf", vocab=5)
    data = open(path, "rb").read()
    bad = tmp_path / "dup.gguf"
    bad.write_bytes(data.replace(b"t.i8", b"t.u8", 1))
    with pytest.raises(ValueError, match="'t.u8' appears twice"):
        GGUFFile(str(bad))
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_uint32("general.alignment", 48)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="general.alignment is 48: not a power of two"):
        GGUFFile(str(tmp_path / "a.gguf"))


def _gguf(kvs=b"", n_kv=0, tensors=b"", n_tensors=0, data=b""):
    """A little-endian GGUF v3 from raw parts."""
    import struct
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors
    return head + b"\0" * (-len(head) % 32) + data


def _text(s):
    import struct
    return struct.pack("<Q", len(s)) + s.encode()


def test_hostile_structures_are_value_errors(tmp_path):
    """What gguf-py itself trips on: a quantised tensor with no dimensions (an IndexError there),
    arrays of arrays thousands deep (a RecursionError); and an alignment not a uint32 (gguf-py's
    rule). Each is a ValueError that says what is wrong."""
    import struct
    q8 = int(gguf.GGMLQuantizationType.Q8_0)
    cases = [
        (_gguf(tensors=_text("q") + struct.pack("<IIQ", 0, q8, 0), n_tensors=1, data=b"\0" * 64),
         "the Q8_0 tensor 'q' of shape () is not whole blocks of 32"),
        (_gguf(_text("deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000
               + struct.pack("<IQ", 4, 0), 1), "arrays nested deeper than 8"),
        (_gguf(_text("general.alignment") + struct.pack("<IB", 0, 1), 1),
         "general.alignment is of GGUF type 0, not a uint32"),
    ]
    for data, why in cases:
        (tmp_path / "h.gguf").write_bytes(data)
        with pytest.raises(ValueError) as e:
            GGUFFile(str(tmp_path / "h.gguf"))
        assert str(e.value) == why
