"""SentencePiece vocabularies in GGUF files (tokenizer.ggml.model "llama": Mistral, Llama 2):
a vocabulary learned here by SentencePiece's BPE (pieces scored by when they were learned, bytes
as <0xNN> tokens), written as llama.cpp's converter writes one, encodes and decodes as llama.cpp
does where llama-cpp-python is installed, and as transformers' own GGUF tokenizer does except
where transformers departs from SentencePiece: its dummy prefix is skipped before leading spaces
and after special tokens, where SentencePiece and llama.cpp put one."""

import pytest

from linnet.nest.tokenizer import Tokenizer

pytest.importorskip("gguf")

TEXTS = ["the quick brown fox", "The Quick  brown\nfox!", "  leading spaces", "naïve café 😀 end",
         "dog</s>fox", "x", "the\n\nlazy dog waits", "thethethe foxes"]


def test_encodes_and_decodes_as_transformers_does(spm_gguf):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(str(spm_gguf.parent), gguf_file=spm_gguf.name)
    ours = Tokenizer.from_gguf(spm_gguf)
    for text in TEXTS:
        if text.startswith(" ") or "</s>" in text:
            continue  # where transformers leaves out the dummy prefix (below)
        ids = ours.encode(text)
        assert ids == reference.encode(text), text
        assert ids[0] == 1  # the GGUF asks for BOS
        assert ours.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True), text
    # bytes with no piece of their own fall back to <0xNN> tokens, and decode whole
    emoji = ours.encode("😀", add_special_tokens=False)
    assert [ours.id_to_token(i) for i in emoji][-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert ours.decode(emoji) == "😀"


def test_learned_pieces_and_the_dummy_prefix(spm_gguf):
    ours = Tokenizer.from_gguf(spm_gguf)
    pieces = lambda text: [ours.id_to_token(i) for i in ours.encode(text, add_special_tokens=False)]
    assert pieces("the fox") == ["▁the", "▁fox"]
    # SentencePiece puts "▁" before the text whatever it starts with, and llama.cpp again after
    # each special token
    assert pieces("  the") == ["▁", "▁", "▁the"]
    assert pieces("dog</s>fox") == ["▁dog", "</s>", "▁fox"]


def test_encodes_as_llama_cpp_does(spm_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(spm_gguf), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(spm_gguf)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == llm.tokenize(text.encode(), add_bos=True, special=True), text
        assert ours.decode(ids, skip_special_tokens=True) == llm.detokenize(ids).decode(), text


def test_pieces_join_into_a_token_of_any_type_as_llama_cpp_joins_them(spm_vocabulary, write_spm_gguf, tmp_path):
    """llama.cpp (and transformers reading the file) joins two pieces wherever their join is a token,
    whatever its type: here a control token of three spaces. Linnet joined only into normal and
    user-defined tokens: "x   y" was ["▁", "x", "▁▁", "▁", "y"], llama.cpp's ["▁", "x", "▁▁▁", "y"]."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokens, types, scores = spm_vocabulary
    path = write_spm_gguf(tmp_path / "spaces.gguf", tokens + ["▁▁", "▁▁▁"], types + [1, 3], scores + [-5.0, -6.0])
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert ours.encode("x   y", add_special_tokens=False)[2] == len(tokens) + 1
    for text in ("x   y", "dog   lazy", "the fox   ", "a      b"):
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text
