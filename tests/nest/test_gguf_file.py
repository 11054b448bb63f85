"""`gguf_file.open_reader`: gguf's own reader, parsing through a plain view of its memory map,
reads what the stock reader reads: every field's parts and every tensor's bytes."""

from __future__ import annotations

import numpy as np
import pytest

from linnet.nest import gguf_file

gguf = pytest.importorskip("gguf")


def same_reading(path):
    quick, stock = gguf_file.open_reader(str(path)), gguf.GGUFReader(str(path))
    assert type(quick) is not gguf.GGUFReader  # the plain-view reader is the one in use
    assert list(quick.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        mine = quick.fields[name]
        assert (mine.offset, mine.types, mine.data) == (field.offset, field.types, field.data), name
        assert len(mine.parts) == len(field.parts), name
        for a, b in zip(mine.parts, field.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert [t.name for t in quick.tensors] == [t.name for t in stock.tensors]
    for a, b in zip(quick.tensors, stock.tensors):
        assert (a.tensor_type, list(a.shape), a.n_elements, a.data_offset) == \
            (b.tensor_type, list(b.shape), b.n_elements, b.data_offset), a.name
        assert a.data.dtype == b.data.dtype and a.data.tobytes() == b.data.tobytes(), a.name
    return quick


def test_the_embedded_gguf_reads_as_the_stock_reader_reads_it(gguf_path):
    reader = same_reading(gguf_path)
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == 49152  # SmolLM2's vocabulary, every string


def test_a_written_gguf_reads_the_same(spm_gguf):
    same_reading(spm_gguf)


def test_a_reader_of_another_spelling_is_used_as_it_is():
    class Other:
        def _get(self, offset, dtype, count=1):  # not the signature the plain view overrides
            pass

    assert gguf_file._reader_class(Other) is Other
