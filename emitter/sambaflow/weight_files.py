"""How a weights folder holds a program's leaves, read one way everywhere: the VM and the pipeline
import this module, and the emitter copies its functions verbatim into every model.py (it imports
only what model.py imports, and never torch).

A leaf's value is, in the folder:
- `<leaf>.f64` / `<leaf>.f32`: raw little-endian row-major values, exactly rows·cols of them;
- `<leaf>.npy`: a float64 or float32 array of the leaf's shape, or its rows·cols values as 1-D;
- a tensor named `<leaf>` in a `.safetensors` file (F64 or F32, same shapes as .npy).
Every form comes down to one run of little-endian values at an offset of a file, so each reader
maps it (no copy). A leaf held twice is an error; a file that holds no leaf is not one of its
files ("unmatched": the callers warn). numpy is imported where a function maps or parses a file:
the pipeline's keys read only `claimed_files`, on every no-op, without loading it."""

import json
import os

LEAF_SUFFIXES = (".f64", ".f32", ".npy")   # a leaf's own file: <leaf><suffix>
TENSOR_FILES = ".safetensors"              # a file of tensors named by leaf
DTYPE_NAMES = {"<f8": "float64", "<f4": "float32"}
SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4"}
HEADER_LIMIT = 100 << 20   # the safetensors format's own cap on its JSON header
NPY_HEADER_LIMIT = 10000 + 16   # numpy's cap on a .npy header it reads, with the preamble


class WeightsError(ValueError):
    """A weights folder that cannot give a leaf its value: `path` (the file, or the folder) and
    what is wrong; str() is `PATH: message`, one line."""

    def __init__(self, path, message):
        super().__init__(f"{path}: {message}")
        self.path, self.message = str(path), message


def claimed_files(names, leaves):
    """Which of a folder's file `names` a program with `leaves` may read: each leaf's own file,
    and every .safetensors file (its tensors are only known by reading it). By name alone, no
    file opened: what a key hashes, never fewer files than a reader reads."""
    own = {leaf + s for leaf in leaves for s in LEAF_SUFFIXES}
    return {n for n in names if n in own or n.endswith(TENSOR_FILES)}


def size_refusal(name, size, shapes, limit):
    """Why the file `name` of `size` bytes, claimed by a leaf of `shapes` ({leaf: (rows, cols)}),
    is refused for its size alone, or None: a leaf's raw file is exactly its values, a .npy file
    its values and a header numpy reads, and no file is over `limit` bytes and a header
    (limits.tensor_bytes: every tensor of the program in float64). What a key records in place of
    a file's sha256: a file no reader accepts is never read whole."""
    stem, suffix = os.path.splitext(name)
    rows, cols = shapes.get(stem, (None, None))
    if size > limit + 8 + HEADER_LIMIT:   # (whatever it is: no leaf takes more, header aside)
        return (f"a file of {size} bytes, more than every tensor of the program takes in float64 "
                f"(limits.tensor_bytes, {limit}): keep its leaves in a file of their own, or raise "
                "the limit")
    if suffix in (".f64", ".f32") and rows is not None:
        itemsize = 8 if suffix == ".f64" else 4
        if size != rows * cols * itemsize:
            return (f"`{stem}` is {rows} by {cols}: expected {rows * cols * itemsize} bytes of "
                    f"{DTYPE_NAMES['<f8' if itemsize == 8 else '<f4']}, the file has {size}")
    elif suffix == ".npy" and rows is not None:
        if size > rows * cols * 8 + NPY_HEADER_LIMIT:
            return (f"`{stem}` is {rows} by {cols}: its .npy file takes at most "
                    f"{rows * cols * 8 + NPY_HEADER_LIMIT} bytes, the file has {size}")
    return None


def npy_place(path):
    """(dtype, byte offset, shape, fortran order) of a .npy file's array, from its header."""
    import numpy as np
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            return dtype.str, f.tell(), tuple(shape), fortran
    except Exception as e:   # (ValueError, EOFError, tokenize's TokenError...) numpy names no file
        raise WeightsError(path, f"not a .npy file numpy can read ({type(e).__name__}: {e})") from None


def safetensors_places(path):
    """{tensor name: (dtype, byte offset, shape, bytes)} of a .safetensors file, from its header
    (8 bytes little-endian: the JSON header's length; then the header); a WeightsError names the
    file and the tensor whose entry is not what the format says."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(HEADER_LIMIT, size - 8):
            raise WeightsError(path, "not a safetensors file (its first 8 bytes are not the length "
                                     "of a header inside the file)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:   # (nested past the parser's depth)
            raise WeightsError(path, f"the safetensors header is not JSON ({str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise WeightsError(path, "the safetensors header is not a JSON object")
    places = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            ok = isinstance(dtype, str) and all(isinstance(x, int) and x >= 0 for x in [*shape, begin, end])
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok or not begin <= end <= size - 8 - n:
            raise WeightsError(path, f"tensor `{name}`: its header entry is not a dtype, a shape and "
                                     "data offsets inside the file")
        places[name] = (SAFETENSORS_DTYPES.get(dtype, dtype), 8 + n + begin, tuple(shape), end - begin)
    return places


def file_place(path, suffix):
    """(dtype, byte offset, shape or None for a raw file, bytes) of a leaf's own file."""
    if suffix != ".npy":
        return ("<f8" if suffix == ".f64" else "<f4"), 0, None, os.path.getsize(path)
    dtype, offset, shape, fortran = npy_place(path)
    if fortran and len(shape) == 2 and min(shape) > 1:
        raise WeightsError(path, "the array is in Fortran (column-major) order; save it with "
                                 "np.save(path, np.ascontiguousarray(a))")
    return dtype, offset, shape, os.path.getsize(path) - offset


def weight_places(directory, leaves):
    """{leaf: place} for each of `leaves` a file of `directory` holds, and the names of the files
    that hold one. A place is (file name, tensor name or None, dtype, byte offset, shape or None
    for a raw file, bytes). A leaf in two files, or a leaf's file that is not a regular file, is a
    WeightsError."""
    wanted, places, claimed = set(leaves), {}, set()
    for name in sorted(n for n in os.listdir(directory) if not n.startswith(".")):
        path = os.path.join(directory, name)
        stem, suffix = os.path.splitext(name)
        if stem in wanted and suffix in LEAF_SUFFIXES:
            if not os.path.isfile(path):
                raise WeightsError(directory, f"`{name}` is not a regular file (the leaf `{stem}`)")
            found = [(stem, (name, None) + file_place(path, suffix))]
        elif suffix == TENSOR_FILES and os.path.isfile(path):
            found = [(t, (name, t) + p) for t, p in sorted(safetensors_places(path).items()) if t in wanted]
        else:
            continue
        for leaf, place in found:
            if leaf in places:
                raise WeightsError(directory, f"both `{places[leaf][0]}` and `{name}` hold `{leaf}`; "
                                              "keep one")
            places[leaf] = place
            claimed.add(name)
    return places, claimed


def weight_array(directory, place, leaf, rows, cols, mode="r"):
    """The values of `leaf` (rows by cols) at `place` (weight_places'), as a map of its file of
    shape (rows, cols) and the file's dtype (`mode` is np.memmap's: "r", or "c" for copy-on-write).
    A dtype other than float64 or float32, another shape, or a size that is not the shape's is a
    WeightsError naming the file and, in a .safetensors file, the tensor."""
    import numpy as np
    name, tensor, dtype, offset, shape, size = place
    path = os.path.join(directory, name)
    what = f"tensor `{tensor}`" if tensor else f"`{leaf}`"
    if dtype not in DTYPE_NAMES:
        raise WeightsError(path, f"{what} holds {dtype} values; a leaf's must be float64 or float32")
    itemsize, count = np.dtype(dtype).itemsize, rows * cols
    if shape is None and size != count * itemsize:   # a raw file: its size is all it says
        raise WeightsError(path, f"`{leaf}` is {rows} by {cols}: expected {count * itemsize} bytes of "
                                 f"{DTYPE_NAMES[dtype]}, the file has {size}")
    if shape is not None and shape not in ((rows, cols), (count,)):
        raise WeightsError(path, f"{what} is {' by '.join(map(str, shape)) or 'a scalar'}, the "
                                 f"program's `{leaf}` is {rows} by {cols} (or {count} values 1-D)")
    if shape is not None and size != count * itemsize:
        raise WeightsError(path, f"{what} should take {count * itemsize} bytes, the file holds {size}")
    if count == 0:
        return np.zeros((rows, cols), dtype=dtype)
    return np.memmap(path, dtype=dtype, mode=mode, offset=offset, shape=(rows, cols))
