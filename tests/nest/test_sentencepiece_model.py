"""A Hugging Face directory whose tokenizer is a SentencePiece tokenizer.model alone (no
tokenizer.json, as Llama 2's and Mistral's repositories may ship it): Linnet reads the file's
pieces as llama.cpp's converter does, and encodes a few hundred texts (unicode, runs of spaces,
special tokens) and decodes them as llama.cpp does from a GGUF of the same vocabulary (as Linnet's
reading of that GGUF does); where the
sentencepiece package is installed, a model it trains encodes as it does. A unigram model, a file
that is no model, and a directory with neither tokenizer file are errors naming the file."""

import json
import random
import shutil

import pytest

from linnet.nest.errors import TokenizerError
from linnet.nest.tokenizer import Tokenizer

UNKNOWN, CONTROL = 2, 3
PIECES = ["the", "▁quick", "brown", "fox", "▁dog", "lazy", "s", "e", "o", "n", " ", "  ", "\n"]
EXTRA = ["naïve", "café", "😀", "日本語", "Ωμέγα", "🇫🇷", "\t", "a\u0301", "12345", "!?", "<s>", "</s>", "<unk>"]


def model_proto(tokens, types, scores, model_type=2, dummy_prefix=True) -> bytes:
    """A tokenizer.model as SentencePiece writes it (its protobuf ModelProto), from the protobuf
    schema transformers ships."""
    pytest.importorskip("google.protobuf")
    from transformers.utils import sentencepiece_model_pb2_new as pb

    model = pb.ModelProto()
    for token, kind, score in zip(tokens, types, scores):
        model.pieces.add(piece=token, type=kind, score=score)
    model.trainer_spec.model_type = model_type
    model.trainer_spec.byte_fallback = True
    model.trainer_spec.unk_id, model.trainer_spec.bos_id, model.trainer_spec.eos_id = 0, 1, 2
    model.trainer_spec.pad_id = -1
    model.normalizer_spec.name = "identity"
    model.normalizer_spec.add_dummy_prefix = dummy_prefix
    model.normalizer_spec.remove_extra_whitespaces = False
    return model.SerializeToString()


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory, spm_vocabulary):
    """The GGUF's SentencePiece vocabulary as a tokenizer.model with a tokenizer_config.json that names
    no special token (the model's own are taken)."""
    d = tmp_path_factory.mktemp("spm-dir")
    (d / "tokenizer.model").write_bytes(model_proto(*spm_vocabulary))
    (d / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "add_eos_token": False}))
    return d


def texts(count=300, seed=0):
    rng = random.Random(seed)
    return [("" if rng.random() < 0.7 else rng.choice([" ", "  ", "\n"]))
            + "".join(rng.choice(PIECES + EXTRA) + rng.choice(["", " ", " ", "  "]) for _ in range(rng.randint(1, 8)))
            for _ in range(count)]


def test_encodes_and_decodes_as_llama_cpp_does(spm_dir, spm_gguf):
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(spm_gguf), vocab_only=True, verbose=False)
    ours, from_gguf = Tokenizer.from_dir(spm_dir), Tokenizer.from_gguf(spm_gguf)
    assert (ours.bos_token, ours.eos_token, ours.bos_token_id, ours.eos_token_ids) == ("<s>", "</s>", 1, [2])
    assert ours.special_tokens["unk_token"] == "<unk>"
    for text in texts():
        ids = ours.encode(text)
        assert ids == llm.tokenize(text.encode(), add_bos=True, special=True) == from_gguf.encode(text), text
        assert ours.decode(ids, skip_special_tokens=True) == llm.detokenize(ids).decode(), text


def test_tokens_the_tokenizer_config_adds(spm_dir, tmp_path):
    """tokenizer_config.json's added tokens past the model's pieces take the next ids, special ones
    matched whole and dropped by skip_special_tokens, as transformers adds them; EOS added on request."""
    d = shutil.copytree(spm_dir, tmp_path / "t")
    base = Tokenizer.from_dir(spm_dir).vocab_size
    config = {"add_bos_token": False, "add_eos_token": True, "eos_token": "<|end|>",
              "added_tokens_decoder": {str(base): {"content": "<|end|>", "special": True},
                                       str(base + 1): {"content": "<tool>", "special": False},
                                       "1": {"content": "<s>", "special": True}}}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.from_dir(d)
    assert tok.vocab_size == base + 2 and tok.eos_token_ids == [base]
    ids = tok.encode("the fox<|end|>")
    assert ids[-2:] == [base, base] and ids[0] != 1  # <|end|> matched whole, then the EOS asked for
    assert tok.decode(ids, skip_special_tokens=True) == "the fox"
    assert tok.token_to_id("<tool>") == base + 1 and base + 1 in tok.encode("a <tool> b")
    config["added_tokens_decoder"] = {str(base + 3): {"content": "<gap>", "special": True}}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match=rf"tokenizer.model: tokenizer_config.json adds '<gap>' as token {base + 3}"):
        Tokenizer.from_dir(d)


def test_a_model_sentencepiece_trains_encodes_as_sentencepiece_does(tmp_path):
    """The real library's BPE model (learned pieces, byte fallback, split digits, a user-defined
    symbol) read here: the same ids as SentencePiece's own encoder on texts that hold no special or
    added token's text (SentencePiece reads "<s>" in a text as its characters, transformers and
    llama.cpp as the token; after one, Linnet puts the dummy "▁" as llama.cpp does)."""
    import io

    spm = pytest.importorskip("sentencepiece")

    def plain(text):
        return text.replace("<s>", "").replace("</s>", "").replace("<unk>", "")

    corpus = [plain(t) for t in texts(2000, seed=1)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus), model_writer=model, model_type="bpe",
                                   vocab_size=600, byte_fallback=True, split_digits=True, minloglevel=2,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   user_defined_symbols=["<tool>"], allow_whitespace_only_pieces=True)
    (tmp_path / "tokenizer.model").write_bytes(model.getvalue())
    reference = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    ours = Tokenizer.from_dir(tmp_path)
    assert ours.vocab_size == reference.get_piece_size()
    for text in map(plain, texts(300, seed=2)):
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text), text
        assert ours.decode(ids) == reference.decode(ids), text


def test_pieces_tied_on_score_merge_leftmost_first_as_sentencepiece_merges_them(tmp_path):
    """Of pairs whose joins score the same, SentencePiece (as llama.cpp) merges the leftmost first;
    Linnet's ranked merges took the one whose left piece has the lower id: "dab" was ["▁", "d", "ab"],
    SentencePiece's ["▁", "da", "b"]."""
    spm = pytest.importorskip("sentencepiece")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("▁abcd") + ["cd", "bc", "ab", "da"]
    types = [UNKNOWN, CONTROL, CONTROL] + [6] * 256 + [1] * 9
    (tmp_path / "tokenizer.model").write_bytes(model_proto(tokens, types, [0.0] * 259 + [-1000.0] * 5 + [-5.0] * 4))
    reference = spm.SentencePieceProcessor(model_file=str(tmp_path / "tokenizer.model"))
    ours = Tokenizer.from_dir(tmp_path)
    for text in ("dab", "abcda", "cdab dabc", "bcd x da", "a bcdab  cdabcd"):
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text), text


def test_added_tokens_take_the_whitespace_the_tokenizer_config_gives_them(spm_vocabulary, write_spm_gguf, tmp_path):
    """tokenizer_config.json's added tokens that rstrip (Phi-3's: all but <unk>, <s> and <|endoftext|>, </s>
    too) take the whitespace after them, as transformers makes them: Linnet kept it, so "the fox<|end|>\\n
    <|assistant|>\\n" was [<s>, ▁the, ▁fox, <|end|>, ▁, <0x0A>, <|assistant|>, ▁, <0x0A>], transformers'
    [<s>, ▁the, ▁fox, <|end|>, <|assistant|>]. Encoded as llama.cpp encodes a GGUF of the vocabulary named
    Phi-3 (which strips by that name), its "▁" after a special token and all (but for U+00A0 and Unicode's other
    spaces, which transformers strips too and llama.cpp keeps)."""
    tokens, types, scores = spm_vocabulary
    (tmp_path / "tokenizer.model").write_bytes(model_proto(tokens, types, scores))
    chat = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"]
    flags = {"<unk>": False, "<s>": False, "</s>": True, **{t: t != "<|endoftext|>" for t in chat}}
    added = {str(tokens.index(t) if t in tokens else len(tokens) + chat.index(t)):
             {"content": t, "lstrip": False, "normalized": False, "rstrip": rstrip, "single_word": False,
              "special": t != "</s>"} for t, rstrip in flags.items()}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "added_tokens_decoder": added}))
    ours = Tokenizer.from_dir(tmp_path)
    everything = tokens + chat
    assert [everything[i] for i in ours.encode("the fox<|end|>\n<|assistant|>\n")] == [
        "<s>", "▁the", "▁fox", "<|end|>", "<|assistant|>"]
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_spm_gguf(tmp_path / "phi.gguf", everything, types + [3] * 4, scores + [0.0] * 4, name="Phi-3")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in ("<|user|>\nthe fox<|end|>\n<|assistant|>\n", "the </s>  \t dog <|endoftext|>  fox", "<|end|> \n"):
        ids = ours.encode(text)
        assert ids == llm.tokenize(text.encode(), add_bos=True, special=True), text
        assert ours.decode(ids, skip_special_tokens=True) == llm.detokenize(ids).decode(), text


def test_a_llama_directory_with_only_a_tokenizer_model_loads_its_tokenizer(spm_dir, spm_vocabulary, tmp_path):
    transformers = pytest.importorskip("transformers")
    import warnings

    from linnet import nest

    cfg = transformers.LlamaConfig(vocab_size=len(spm_vocabulary[0]), hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, intermediate_size=48,
                                   max_position_embeddings=64)
    d = tmp_path / "llama-2-like"
    transformers.LlamaForCausalLM(cfg).save_pretrained(d)
    for name in ("tokenizer.model", "tokenizer_config.json"):
        shutil.copy(spm_dir / name, d / name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "no tokenizer loaded" was warned, and the model ran on ids alone
        model = nest.load(d, backend="torch", generics={"Batch": 1, "MaxSeq": 16})
    assert model.tokenizer.encode("the lazy dog") == Tokenizer.from_dir(spm_dir).encode("the lazy dog")
    # named as vLLM's --tokenizer names one: the directory, or the file itself
    for named in (spm_dir, spm_dir / "tokenizer.model"):
        model = nest.load(d, backend="torch", generics={"Batch": 1, "MaxSeq": 16}, tokenizer=named)
        assert model.tokenizer.source == str(spm_dir)


def test_a_directory_without_tokenizer_files_warns_once_where_it_looked(tiny_hf, tmp_path):
    from linnet import nest

    d = shutil.copytree(tiny_hf[1], tmp_path / "no-tokenizer")
    (d / "tokenizer_config.json").write_text("{}")  # a config alone is no tokenizer
    with pytest.warns(UserWarning) as caught:
        model = nest.load(d, backend="torch", generics={"Batch": 1, "MaxSeq": 16})
    assert model.tokenizer is None
    assert [str(w.message) for w in caught if "tokenizer" in str(w.message)] == [
        f"no tokenizer loaded from {d}: no tokenizer.json, nor a SentencePiece tokenizer.model to build one from "
        "(a model's tokenizer is one of these files)"]


def test_what_is_not_a_bpe_model_is_named(spm_vocabulary, tmp_path):
    (tmp_path / "tokenizer.model").write_bytes(model_proto(*spm_vocabulary, model_type=1))
    with pytest.raises(TokenizerError, match=r"tokenizer.model: a SentencePiece unigram model; Linnet reads "
                                             r"SentencePiece BPE models"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\xff\x01not a model")
    with pytest.raises(TokenizerError, match=r"tokenizer.model: not a SentencePiece model"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.model").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"no tokenizer.json, nor a SentencePiece tokenizer.model"):
        Tokenizer.from_dir(tmp_path)
