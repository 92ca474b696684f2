"""A GGUF file's metadata and tensor list, read with `struct` in one pass.

gguf-py's GGUFReader makes a NumPy view for every part of every field: for Gemma 3's 262144-entry
vocabulary (three arrays of it) that is millions of views, 30 s and more per open on this project's
machines, and each import opens its checkpoint twice. This reads the same layout (GGUF versions 2
and 3, either byte order: a big-endian file's quantised blocks are refused where they would be
dequantised, gguf_file.tensor_array) in well under a second, refusing with a ValueError whatever does not
fit the file; `fields[key].contents()` is GGUFReader's (a number, a bool, a str, or a list of
them; an array of arrays nested, where GGUFReader flattens it) and each tensor's `data` is
GGUFReader's map of its bytes (the same dtype and shape), for gguf-py's `dequantize`.
"""

import struct
from collections import namedtuple

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY, UINT32 = 8, 9, 4
DEFAULT_ALIGNMENT = 32
MAX_NESTING = 8   # arrays of arrays: deeper is refused (gguf-py flattens them; nothing reads one)

Tensor = namedtuple("Tensor", "name tensor_type shape n_elements n_bytes data_offset data")


class Field(namedtuple("Field", "name value")):
    def contents(self):
        return list(self.value) if isinstance(self.value, list) else self.value


class GGUFFile:
    """`fields` ({key: Field}, in the file's order) and `tensors` (a list of Tensor) of a GGUF."""

    def __init__(self, path):
        self.path = str(path)
        self.map = np.memmap(path, mode="r")
        self.buf, self.at = memoryview(self.map), 0
        if len(self.buf) < 24 or bytes(self.buf[:4]) != MAGIC:
            raise ValueError("GGUF magic invalid")
        version = struct.unpack_from("<I", self.buf, 4)[0]
        self.order = ">" if version & 0xFFFF == 0 else "<"   # written on a big-endian machine
        version = self._take("I", 4)
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version}, not one of {', '.join(map(str, VERSIONS))}")
        n_tensors, n_kv = self._take("Q"), self._take("Q")
        self.fields = {}
        for _ in range(self._count(n_kv, 13, "metadata entries")):
            key = self._string()
            if key in self.fields:
                raise ValueError(f"the metadata key {key!r} appears twice")
            kind = self._take("I")
            if key == "general.alignment" and kind != UINT32:
                raise ValueError(f"general.alignment is of GGUF type {kind}, not a uint32")
            self.fields[key] = Field(key, self._value(kind))
        infos = [self._tensor_info() for _ in range(self._count(n_tensors, 24, "tensors"))]
        align = self.fields["general.alignment"].value if "general.alignment" in self.fields \
            else DEFAULT_ALIGNMENT
        if align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment is {align!r}: not a power of two")
        start = -(-self.at // align) * align
        self.tensors = self._tensors(infos, start)

    def _need(self, size):
        if size < 0 or self.at + size > len(self.buf):
            raise ValueError(f"the file ends at byte {len(self.buf)}, inside what starts at byte {self.at}")

    def _take(self, code, at=None):
        if at is not None:
            self.at = at
        size = struct.calcsize(code)
        self._need(size)
        value = struct.unpack_from(self.order + code, self.buf, self.at)[0]
        self.at += size
        return value

    def _count(self, n, least, what):
        """`n` entries of at least `least` bytes each, or a ValueError where the file is too short."""
        if n * least > len(self.buf) - self.at:
            raise ValueError(f"{n} {what} do not fit in its {len(self.buf)} bytes")
        return n

    def _string(self):
        return self._strings(1)[0]

    def _strings(self, n):
        """`n` strings in a row (a vocabulary: 262144 of them in gemma3's), each its uint64 size
        and its UTF-8 bytes, in one loop."""
        buf, at, end, size_of = self.buf, self.at, len(self.buf), struct.Struct(self.order + "Q").unpack_from
        out = []
        for _ in range(n):
            if at + 8 > end:
                self.at = at
                self._need(8)
            size = size_of(buf, at)[0]
            at += 8
            if at + size > end:
                self.at = at
                self._need(size)
            out.append(str(buf[at:at + size], "utf-8"))
            at += size
        self.at = at
        return out

    def _value(self, kind, depth=0):
        if kind == STRING:
            return self._string()
        if kind in SCALARS:
            return self._take(SCALARS[kind])
        if kind != ARRAY:
            raise ValueError(f"metadata value type {kind} is not a GGUF type")
        item, n = self._take("I"), self._take("Q")
        if item in SCALARS:
            dtype = np.dtype(self.order + SCALARS[item])
            self._count(n, dtype.itemsize, "array items")
            values = np.frombuffer(self.buf, dtype, n, self.at).tolist()
            self.at += n * dtype.itemsize
            return values
        if item == STRING:
            return self._strings(self._count(n, 8, "array items"))
        if item == ARRAY and depth >= MAX_NESTING:
            raise ValueError(f"arrays nested deeper than {MAX_NESTING}")
        return [self._value(item, depth + 1) for _ in range(self._count(n, 8 if item == STRING else 12,
                                                                        "array items"))]

    def _tensor_info(self):
        name = self._string()
        dims = [self._take("Q") for _ in range(self._count(self._take("I"), 8, "dimensions"))]
        return name, dims, self._take("I"), self._take("Q")

    def _tensors(self, infos, start):
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
        from gguf.quants import quant_shape_to_byte_shape
        plain = {Q.F16: np.float16, Q.F32: np.float32, Q.F64: np.float64, Q.I8: np.int8,
                 Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}
        tensors, names = [], set()
        for name, dims, raw, offset in infos:
            if name in names:
                raise ValueError(f"the tensor {name!r} appears twice")
            names.add(name)
            kind = Q(raw)
            block, size = GGML_QUANT_SIZES[kind]
            n = int(np.prod(dims, dtype=object)) if dims else 1
            shape = tuple(reversed(dims))
            n_bytes = n * size // block
            at = start + offset
            if at + n_bytes > len(self.buf):
                raise ValueError(f"the tensor {name!r} runs past the end of the file")
            if kind in plain:
                data = self.map[at:at + n_bytes].view(np.dtype(plain[kind]).newbyteorder(self.order))
            else:
                if not shape or shape[-1] % block:
                    raise ValueError(f"the {kind.name} tensor {name!r} of shape {shape} is not whole blocks "
                                     f"of {block}")
                shape = quant_shape_to_byte_shape(shape, kind)
                data = self.map[at:at + n_bytes]
            tensors.append(Tensor(name, kind, tuple(dims), n, n_bytes, at, data.reshape(shape)))
        return tensors
