"""`gguf_file.GGUFFile`, Linnet's own reading of a GGUF header: it reads what gguf's reader reads
(the embedded model, a written vocabulary), gives back what gguf's writer was handed (random
metadata and tensors, either byte order), and a file cut anywhere is a `GGUFFormatError` that
says where, never another exception."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from linnet.nest.gguf_file import GGUFFile, GGUFFormatError  # noqa: E402  (needs gguf)

V = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType


def reads_as_gguf_reads(path):
    ours, stock = GGUFFile(str(path)), gguf.GGUFReader(str(path))
    keys = [k for k in stock.fields if not k.startswith("GGUF.")]  # its own pseudo-keys: version and counts
    assert list(ours.fields) == keys
    for key in keys:
        field, mine = stock.fields[key], ours.fields[key]
        assert mine.value == field.contents(), key
        assert mine.type == field.types[0], key
        assert mine.element_type == (field.types[-1] if field.types[0] == V.ARRAY else None), key
    assert list(ours.tensors) == [t.name for t in stock.tensors]
    for t in stock.tensors:
        mine = ours.tensors[t.name]
        assert (mine.type, mine.shape, mine.offset) == (t.tensor_type, tuple(reversed(t.shape.tolist())), t.data_offset)
        assert mine.data.dtype == t.data.dtype and mine.data.shape == t.data.shape, t.name
        assert mine.data.tobytes() == t.data.tobytes() and not mine.data.flags.writeable, t.name
    return ours


def test_the_embedded_gguf_reads_as_gguf_reads_it(gguf_path):
    file = reads_as_gguf_reads(gguf_path)
    assert len(file.fields["tokenizer.ggml.tokens"].value) == 49152  # SmolLM2's vocabulary, every string


def test_a_written_vocabulary_reads_as_gguf_reads_it(spm_gguf):
    reads_as_gguf_reads(spm_gguf)


# -- what the writer was handed comes back

SCALARS = {
    V.UINT8: st.integers(0, 2 ** 8 - 1), V.INT8: st.integers(-2 ** 7, 2 ** 7 - 1),
    V.UINT16: st.integers(0, 2 ** 16 - 1), V.INT16: st.integers(-2 ** 15, 2 ** 15 - 1),
    V.UINT32: st.integers(0, 2 ** 32 - 1), V.INT32: st.integers(-2 ** 31, 2 ** 31 - 1),
    V.UINT64: st.integers(0, 2 ** 64 - 1), V.INT64: st.integers(-2 ** 63, 2 ** 63 - 1),
    V.FLOAT32: st.floats(width=32, allow_nan=False), V.FLOAT64: st.floats(allow_nan=False),
    V.BOOL: st.booleans(), V.STRING: st.text(max_size=12),
}


@st.composite
def fields(draw):
    """(key, value, value type, element type) x a few: scalars of every type, and arrays of them
    (not empty: gguf's writer refuses those)."""
    out = []
    for i in range(draw(st.integers(0, 6))):
        vtype = draw(st.sampled_from(sorted(SCALARS)))
        if draw(st.booleans()):
            out.append((f"test.array{i}", draw(st.lists(SCALARS[vtype], min_size=1, max_size=40)), V.ARRAY, vtype))
        else:
            out.append((f"test.scalar{i}", draw(SCALARS[vtype]), vtype, None))
    return out


@st.composite
def tensors(draw):
    """name -> (array as stored, GGML type or None for the array's own): plain numbers and Q8_0 blocks."""
    out = {}
    for i in range(draw(st.integers(0, 4))):
        rows = draw(st.integers(1, 3))
        kind = draw(st.sampled_from(["f32", "f16", "i32", "q8_0"]))
        rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        if kind == "q8_0":
            values = rng.standard_normal((rows, 32 * draw(st.integers(1, 2)))).astype(np.float32)
            out[f"t{i}"] = (gguf.quants.quantize(values, Q.Q8_0), Q.Q8_0)
        elif kind == "i32":
            out[f"t{i}"] = (rng.integers(-1000, 1000, (rows, draw(st.integers(1, 9)))).astype(np.int32), None)
        else:
            out[f"t{i}"] = (rng.standard_normal((rows, draw(st.integers(1, 9)))).astype(kind.replace("f", "float")), None)
    return out


def write(path, keys, stored, byte_order="<"):
    endian = gguf.GGUFEndian.BIG if byte_order == ">" else gguf.GGUFEndian.LITTLE
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for key, value, vtype, etype in keys:
        w.add_key_value(key, value, vtype, etype)
    for name, (data, qtype) in stored.items():
        w.add_tensor(name, data.copy(), raw_dtype=qtype)  # a copy: a big-endian writer swaps the bytes in place
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def same_value(a, b) -> bool:
    """Equal, and of the same Python type (a bool read back as an int would not do)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_value, a, b))
    return a == b and type(a) is type(b)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(keys=fields(), stored=tensors(), byte_order=st.sampled_from("<>"))
def test_what_the_writer_was_handed_comes_back(tmp_path_factory, keys, stored, byte_order):
    path = write(tmp_path_factory.mktemp("g") / "t.gguf", keys, stored, byte_order)
    file = GGUFFile(str(path))
    assert file.byte_order == byte_order and file.version == 3
    assert file.value("general.architecture") == "llama"
    for key, value, vtype, etype in keys:
        field = file.fields[key]
        assert (field.type, field.element_type) == (vtype, etype), key
        if vtype == V.FLOAT32 or etype == V.FLOAT32:  # written as float32: compare as float32
            value = np.float32(value).tolist() if vtype != V.ARRAY else np.asarray(value, np.float32).tolist()
        assert same_value(field.value, value), key
    assert list(file.tensors) == list(stored)
    for name, (data, qtype) in stored.items():
        t = file.tensors[name]
        assert t.type == (qtype if qtype is not None else {"float32": Q.F32, "float16": Q.F16, "int32": Q.I32}[data.dtype.name])
        assert t.data.shape == data.shape and t.offset % file.alignment == 0
        np.testing.assert_array_equal(np.asarray(t.data, data.dtype.newbyteorder("=")), data)


def test_a_file_cut_anywhere_says_where(tmp_path):
    keys = [("test.words", ["one", "two", "three"], V.ARRAY, V.STRING), ("test.n", 7, V.UINT32, None)]
    stored = {"a": (np.arange(12, dtype=np.float32).reshape(3, 4), None),
              "b": (np.ones((2, 64), np.float32), None)}
    whole = write(tmp_path / "whole.gguf", keys, stored).read_bytes()
    a = GGUFFile(str(tmp_path / "whole.gguf")).tensors["a"]
    header_end, a_end = a.offset, a.offset + a.nbytes
    cut = tmp_path / "cut.gguf"
    for size in range(len(whole)):
        cut.write_bytes(whole[:size])
        with pytest.raises(GGUFFormatError) as err:
            GGUFFile(str(cut))
        message = str(err.value)
        if size == 0:
            assert message == "the file is empty"
        elif size < 4:
            assert message.startswith("not a GGUF file")
        elif size < header_end - 32:  # within the header (its last bytes may be the padding before the data)
            assert "cut short at byte" in message or message.startswith("not a GGUF file"), (size, message)
        elif size >= header_end:  # in the data: the tensor that runs past the end is named
            first_short = "'a'" if size < a_end else "'b'"
            assert message.startswith(f"tensor {first_short}") and message.endswith(f"but the file has {size}"), (size, message)


def test_damaged_headers_are_named(tmp_path):
    good = write(tmp_path / "good.gguf", [], {"w": (np.ones((1, 4), np.float32), None)}).read_bytes()
    # one F32 tensor of dims (0, 2**64 - 1): no values, and a dim no array can have
    empty_but_vast = (b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", 1) + b"a"
                      + struct.pack("<IQQIQ", 2, 0, 2 ** 64 - 1, 0, 0)).ljust(64, b"\0")
    # two keys and two tensors whose names differ in one letter: one changed makes a name appear twice
    pair = write(tmp_path / "pair.gguf", [("test.a", 1, V.UINT32, None), ("test.b", 2, V.UINT32, None)],
                 {"ta": (np.ones((2, 32), np.float32), None),
                  "tb": (gguf.quants.quantize(np.ones((2, 32), np.float32), Q.Q8_0), Q.Q8_0)}).read_bytes()
    info = pair.index(b"\x02\x00\x00\x00\x00\x00\x00\x00ta") + 10  # ta's n_dims, dims, type
    unknown_type = pair[:info + 4 + 16] + struct.pack("<I", 99) + pair[info + 24:]
    # three tensors of 256 bytes; the first's dims [32, 2] made [32, 3]: its 384 bytes run into the
    # second's, within the file (as a type changed from F16 to F32 would)
    three = write(tmp_path / "three.gguf", [], {name: (np.ones((2, 32), np.float32), None)
                                                for name in ("ua", "ub", "uc")}).read_bytes()
    at = three.index(b"ua") + 2
    overlapping = three[:at + 4] + struct.pack("<QQ", 32, 3) + three[at + 20:]
    # the first's dims made [32, 1]: 128 bytes, leaving a gap before the second (as a type changed from F32 to
    # F16 would: its weights would be the first half of its bytes, the second's of the gap's); the last's made
    # [32, 1]: the file goes on past it
    shrunk = three[:at + 4] + struct.pack("<QQ", 32, 1) + three[at + 20:]
    last = three.index(b"uc") + 2
    shrunk_last = three[:last + 4] + struct.pack("<QQ", 32, 1) + three[last + 20:]
    info = pair.index(b"tb", info) + 2  # tb's dims [32, 2] made [16, 4]: half a Q8_0 block a row
    half_blocks = pair[:info + 4] + struct.pack("<QQ", 16, 4) + pair[info + 20:]
    nested = struct.pack("<IQ", 4, 1) + struct.pack("<I", 7)  # an array of one uint32, in 10 arrays
    for _ in range(9):
        nested = struct.pack("<IQ", V.ARRAY, 1) + nested
    too_deep = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 6) + b"test.n"
                + struct.pack("<I", V.ARRAY) + nested)
    aligned_48 = write(tmp_path / "a48.gguf", [("general.alignment", 48, V.UINT32, None)],
                       {"w": (np.ones((1, 4), np.float32), None)}).read_bytes()
    cases = {
        b"GGUX" + good[4:]: "not a GGUF file",
        good[:4] + (9).to_bytes(4, "little") + good[8:]: "GGUF version 9",
        empty_but_vast: r"tensor 'a' has the dims \[0, 18446744073709551615\]",
        # what gguf's reader refuses too (KeyError / ValueError there): the same thing said
        pair.replace(b"test.b", b"test.a"): r"the key 'test.a' at byte \d+ appears twice",
        pair.replace(b"tb", b"ta"): "tensor 'ta' appears twice",
        unknown_type: "tensor 'ta' has the unknown type 99",
        half_blocks: r"tensor 'tb' \[4, 16\]: a row of 16 is not whole Q8_0 blocks of 32",
        overlapping: r"tensor 'ub' \(F32 \[2, 32\]\) is at byte 256 of the data, but the tensors before it end at "
                     r"byte 384 \('ua', F32 \[3, 32\]: 384 bytes\): a type or shape in the header is not the one",
        shrunk: r"tensor 'ub' \(F32 \[2, 32\]\) is at byte 256 of the data, but the tensors before it end at byte 128 "
                r"\('ua', F32 \[1, 32\]: 128 bytes\)",
        shrunk_last: r"the tensors end at byte \d+, but the file has \d+ bytes: a type or shape in the header \(the "
                     r"last tensor's, 'uc', F32 \[1, 32\]: 128 bytes\) is not the one its bytes were written in",
        aligned_48: r"general.alignment is 48, not a power of two",
        too_deep: "arrays nested more than 8 deep at byte",
    }
    for i, (data, message) in enumerate(cases.items()):
        (tmp_path / f"bad{i}.gguf").write_bytes(data)
        with pytest.raises(GGUFFormatError, match=message):
            GGUFFile(str(tmp_path / f"bad{i}.gguf"))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_a_damaged_header_reads_or_says_so(tmp_path_factory, data):
    """Bytes of the header overwritten at random: the file reads (the damage fell in a value), or
    is a GGUFFormatError; never another exception, never a hang."""
    folder = tmp_path_factory.mktemp("d")
    keys = [("test.words", ["one", "two", "three"], V.ARRAY, V.STRING), ("test.n", 7, V.UINT32, None),
            ("test.f", [1.5, 2.5], V.ARRAY, V.FLOAT32)]
    whole = bytearray(write(folder / "whole.gguf", keys, {"a": (np.ones((2, 32), np.float32), None),
                                                           "q": (gguf.quants.quantize(np.ones((2, 32), np.float32), Q.Q8_0), Q.Q8_0)}).read_bytes())
    header_end = GGUFFile(str(folder / "whole.gguf")).tensors["a"].offset
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(4, header_end - 1))
        whole[at] = data.draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x09, 0x08, 0x01]))
    (folder / "bad.gguf").write_bytes(bytes(whole))
    try:
        file = GGUFFile(str(folder / "bad.gguf"))
    except GGUFFormatError:
        return
    for t in file.tensors.values():  # what reads is within the file
        assert t.offset + t.nbytes <= file.size and t.data.nbytes == t.nbytes
