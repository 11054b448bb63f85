"""Tokenizer against transformers' on the embedded SmolLM2 GGUF and on a
Hugging Face tokenizer directory; streaming decode; chat templates."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from linnet.nest.errors import TokenizerError
from linnet.nest.tokenizer import Tokenizer

regex = pytest.importorskip("regex")

TEXTS = [
    "Hello, world!",
    "Café déjà vu — naïve façade, Ærø, Straße",
    "日本語のテキストと中文，한국어",
    "emoji: 😀👍🏽 🇫🇷 👨‍👩‍👧 done",
    "tabs\tand\nnewlines\n\n\nend\r\n",
    "trailing spaces   ",
    "   leading spaces and    inner runs",
    "digits 12345 and 3.14159 and 1,000,000; x42 a1b2c3",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "code: def f(x):\n    return x ** 2  # square\n",
    "I'm sure they'll've done it, can't we?",
    "",
]

# Whitespace runs right before a digit: llama.cpp's "smollm" splitting (digits
# isolated first) and transformers' GGUF tokenizer (GPT-2 regex only) part ways.
DIGIT_AFTER_SPACE = ["a  1", "x\n\n2", "total:\t\t42", "line\n 7", "year   2024\n\n 3"]

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def llama_cpp_smollm_ids(hf_tok, text):
    """llama.cpp's tokenization for pre-tokenizer "smollm": split off every \\p{N},
    split each piece with GPT-2's regex, BPE each part (transformers' BPE)."""
    ids = []
    for chunk in regex.split(r"(\p{N})", text):
        for piece in regex.findall(GPT2_SPLIT, chunk):
            ids += hf_tok.encode(piece, add_special_tokens=False)
    return ids


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_encode_decode_match_transformers(gguf_tokenizer, hf_gguf_tokenizer, text):
    ids = gguf_tokenizer.encode(text)
    assert ids == hf_gguf_tokenizer.encode(text)
    assert gguf_tokenizer.decode(ids) == hf_gguf_tokenizer.decode(ids) == text
    assert gguf_tokenizer.decode(ids, skip_special_tokens=True) == hf_gguf_tokenizer.decode(ids, skip_special_tokens=True)


def test_special_tokens_are_single_ids(gguf_tokenizer):
    ids = gguf_tokenizer.encode("<|im_start|>user<|im_end|><|endoftext|>")
    assert ids[0] == 1 and ids[-2:] == [2, 0]
    assert gguf_tokenizer.decode(ids, skip_special_tokens=True) == "user"


@pytest.fixture(scope="module")
def llama_cpp_vocab(gguf_path):
    """llama.cpp's own tokenizer of the embedded GGUF, where llama-cpp-python is installed; else None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)


@pytest.mark.parametrize("text", DIGIT_AFTER_SPACE + TEXTS[:-4])
def test_gguf_pretokenizer_is_llama_cpps(gguf_tokenizer, hf_gguf_tokenizer, llama_cpp_vocab, text):
    ids = gguf_tokenizer.encode(text)
    assert ids == llama_cpp_smollm_ids(hf_gguf_tokenizer, text)  # (llama.cpp's rule, written out)
    if llama_cpp_vocab is not None:  # and llama.cpp itself
        assert ids == llama_cpp_vocab.tokenize(text.encode(), add_bos=False, special=True)
    assert gguf_tokenizer.decode(ids) == text


def test_digits_split_one_by_one(gguf_tokenizer):
    ids = gguf_tokenizer.encode("a  1")
    assert [gguf_tokenizer.id_to_token(i) for i in ids] == ["a", "ĠĠ", "1"]
    assert [gguf_tokenizer.id_to_token(i) for i in gguf_tokenizer.encode("2024")] == ["2", "0", "2", "4"]


_ALPHABET = st.sampled_from(list("ab Z é日本 😀👍\n\t019.,'-_") + ["  ", "'s", "<|im_end|>"])


@settings(max_examples=150, deadline=None, derandomize=True)
@given(parts=st.lists(_ALPHABET, max_size=14))
def test_random_texts_match_llama_cpp(gguf_tokenizer, hf_gguf_tokenizer, parts):
    text = "".join(parts)
    ids = gguf_tokenizer.encode(text)
    assert gguf_tokenizer.decode(ids) == text
    want = []
    for i, chunk in enumerate(text.split("<|im_end|>")):
        if i:
            want.append(2)
        want += llama_cpp_smollm_ids(hf_gguf_tokenizer, chunk)
    assert ids == want


# pieces of text a few hundred prompts are drawn from: unicode (combining marks, flags, CJK, a
# ligature, no-break and zero-width spaces), runs of spaces and newlines, digits, special tokens
MIXED = ["Hello", " world", "  ", "\n", "\n\n", "\t", "\r\n", "123", "4567890", " 3.14", "naïve", "café",
         "😀", "🇫🇷", "日本語", "Ωμέγα", "a\u0301", " \u00a0 ", "\u200b", "ﬁ", "<|im_start|>", "<|im_end|>",
         "<|endoftext|>", "user", "assistant", " don't", "I'm", "'s", "...", "!!!", "x" * 20,
         "def f(x):\n    return x", "http://a.b/c?d=e"]


def test_a_few_hundred_texts_encode_and_decode_as_llama_cpp_does(gguf_path, gguf_tokenizer):
    """llama.cpp itself (llama-cpp-python) reading the same GGUF, special tokens parsed in the text."""
    import random

    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    rng = random.Random(0)
    for _ in range(400):
        text = "".join(rng.choice(MIXED) for _ in range(rng.randint(1, 10)))
        ids = gguf_tokenizer.encode(text)
        assert ids == llm.tokenize(text.encode(), add_bos=True, special=True), text
        assert gguf_tokenizer.decode(ids).encode() == llm.detokenize(ids, special=True), text


def test_smollm2_ends_generation_where_llama_cpp_does(gguf_path, gguf_tokenizer):
    """The stops read from the GGUF are llama.cpp's own (llama_vocab_is_eog), with one difference."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    ends = {i for i in range(gguf_tokenizer.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    # but <reponame> (4), which llama.cpp takes by its text for its fill-in-the-middle repository
    # token, where Linnet takes such a token only where a key names it (`end_of_generation`)
    assert set(gguf_tokenizer.eos_token_ids) == ends - {4}


@pytest.fixture(scope="module")
def no_pre_gguf(gguf_ckpt, tmp_path_factory):
    """SmolLM2's vocabulary and merges in a GGUF that names no pre-tokenizer (as those written before
    tokenizer.ggml.pre was): llama.cpp splits its text as its "default"; (Linnet's tokenizer,
    llama.cpp's)."""
    gguf = pytest.importorskip("gguf")
    llama_cpp = pytest.importorskip("llama_cpp")
    import numpy as np

    path = tmp_path_factory.mktemp("no-pre") / "no-pre.gguf"
    meta = gguf_ckpt.metadata
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(meta("tokenizer.ggml.tokens"))
    w.add_token_merges(meta("tokenizer.ggml.merges"))
    w.add_token_types(meta("tokenizer.ggml.token_type"))
    w.add_add_bos_token(False)
    w.add_tensor("dummy", np.zeros(1, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Tokenizer.from_gguf(path), llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(parts=st.lists(st.one_of(st.sampled_from([*"ab .,!?'$+<=>^~|`-_0123456789\n\t", "'s", "  ", " 123"]),
                               st.characters(blacklist_categories=("Cs",))), max_size=20))
def test_a_gguf_naming_no_pre_tokenizer_encodes_as_llama_cpp_does(no_pre_gguf, parts):
    """Its splitting was GPT-2's regex alone, llama.cpp's is its "default": punctuation first, digits
    apart from their space, in threes ("x ." was ["x", "Ġ."], llama.cpp's ["x", "Ġ", "."])."""
    ours, llm = no_pre_gguf
    text = "".join(parts)
    assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True)


def test_gguf_special_ids(gguf_tokenizer):
    # the file's EOS, <|im_end|>; and <|endoftext|>, which llama.cpp also ends on by its text
    assert gguf_tokenizer.eos_token_ids == [2, 0]
    assert gguf_tokenizer.bos_token_id == 1
    assert gguf_tokenizer.bos_token == "<|im_start|>" and gguf_tokenizer.eos_token == "<|im_end|>"
    assert gguf_tokenizer.encode("hi", add_special_tokens=True) == gguf_tokenizer.encode("hi", add_special_tokens=False)
    assert gguf_tokenizer.vocab_size == 49152


CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi ☕"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
     {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]


@pytest.mark.parametrize("messages", CHATS)
@pytest.mark.parametrize("gen", [True, False])
def test_chat_template_matches_transformers(gguf_tokenizer, hf_gguf_tokenizer, messages, gen):
    ours = gguf_tokenizer.apply_chat_template(messages, add_generation_prompt=gen)
    want = hf_gguf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert ours == want
    assert ours.endswith("<|im_start|>assistant\n") == gen


# ------------------------------------------------------------ streaming


STREAM_TEXTS = TEXTS + ["🤖🎉🧠 multi-token emoji ✨🫠", "<|im_start|>assistant\nSure! 👋<|im_end|>"]


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_incremental_decoder_concatenates_to_decode(gguf_tokenizer, text, skip):
    ids = gguf_tokenizer.encode(text)
    pieces = list(gguf_tokenizer.incremental_decoder(skip_special_tokens=skip).stream(ids))
    assert "".join(pieces) == gguf_tokenizer.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in p for p in pieces)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(text=st.text(min_size=1, max_size=24))
def test_each_tokens_bytes_add_up_to_the_text(gguf_tokenizer, text):
    """OpenAI's logprob `bytes`: a token that ends inside a character decodes to U+FFFD, but its
    bytes are its own, so the tokens' bytes joined are the text's (byte-level BPE: GPT-2's table)."""
    ids = gguf_tokenizer.encode(text, add_special_tokens=False)
    joined = b"".join(gguf_tokenizer.token_bytes(i) for i in ids)
    decoded = gguf_tokenizer.decode(ids)
    # (a byte the vocabulary has no token for is dropped: then the text is not all there)
    assert joined.decode("utf-8", errors="replace") == decoded
    if decoded == text:
        assert joined == text.encode()


def test_chat_logprobs_give_each_tokens_own_bytes(gguf_tokenizer):
    """An emoji spans byte-level tokens that each decode to U+FFFD: their logprob entries' bytes
    still add up to it, as OpenAI's do."""
    from linnet.serve.openai_replies import chat_logprobs
    from linnet.serve.request import TokenLogprob

    ids = gguf_tokenizer.encode("ok 🫠!", add_special_tokens=False)
    content = chat_logprobs([TokenLogprob(t, -1.0, [(t, -1.0)]) for t in ids], gguf_tokenizer)["content"]
    assert any(e["token"] == "\ufffd" for e in content)
    assert bytes(b for e in content for b in e["bytes"]) == "ok 🫠!".encode()
    assert all(e["top_logprobs"][0]["bytes"] == e["bytes"] for e in content)


def test_a_sentencepiece_tokens_bytes(spm_gguf):
    """SentencePiece: byte tokens <0xNN> are their byte, a piece's "▁" a space."""
    spm = Tokenizer.from_gguf(spm_gguf)
    for text in ("naïve café 😀 end", "the quick brown fox"):
        ids = spm.encode(text, add_special_tokens=False)
        assert b"".join(spm.token_bytes(i) for i in ids) == b" " + text.encode()  # the dummy prefix's space
    assert spm.token_bytes(spm.token_to_id("<0xF0>")) == b"\xf0"


def test_a_metaspace_tokens_bytes_keep_its_spaces():
    """A tokenizer.json whose decoder is Metaspace alone (no byte fallback): each token's bytes hold its
    word's space, which decoding it alone drops; a text's tokens' bytes add up to it, after the space
    Metaspace puts before it."""
    from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "\u2581The": 1, "\u2581capital": 2, "\u2581is": 3, "\u2581Paris": 4, ".": 5}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = Tokenizer(backend)
    text = "The capital is Paris"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [1, 2, 3, 4] and tok.decode(ids) == text and tok.decode([4]) == "Paris"
    assert b"".join(tok.token_bytes(i) for i in ids) == b" " + text.encode()


def test_emoji_split_across_tokens_is_held_back(gguf_tokenizer):
    ids = gguf_tokenizer.encode("ok 🫠!")
    alone = [gguf_tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in a for a in alone), "the emoji should span several byte-level tokens"
    dec = gguf_tokenizer.incremental_decoder()
    pieces = [dec.push(i) for i in ids]
    assert "".join(pieces) + dec.flush() == "ok 🫠!"
    assert "" in pieces  # a partial character produced nothing yet
    assert all("\ufffd" not in p for p in pieces)


def test_flush_emits_incomplete_tail(gguf_tokenizer):
    ids = gguf_tokenizer.encode("🫠")
    dec = gguf_tokenizer.incremental_decoder()
    assert dec.push(ids[0]) == ""
    assert dec.flush() == gguf_tokenizer.decode(ids[:1])  # U+FFFD: the bytes never completed


@pytest.mark.parametrize("text", ["ok 🫠", "日本", "a 🇫🇷"])
def test_a_reply_cut_inside_a_character_ends_before_it(gguf_tokenizer, text):
    """As vLLM's detokenizer: the text stops at the last whole character, with no U+FFFD."""
    ids = gguf_tokenizer.encode(text, add_special_tokens=False)
    whole = text.encode()
    cuts = [n for n in range(len(ids)) if gguf_tokenizer.decode(ids[:n]).endswith("\ufffd")]
    assert cuts, "the text should have a character spread over several tokens"
    for n in range(len(ids) + 1):
        spelled = b"".join(gguf_tokenizer.token_bytes(i) for i in ids[:n])
        expected = spelled.decode("utf-8", errors="ignore")  # only a cut last character can be incomplete here
        assert whole.startswith(spelled)
        dec = gguf_tokenizer.incremental_decoder()
        assert "".join(dec.push(i) for i in ids[:n]) + dec.finish() == expected
        assert gguf_tokenizer.without_cut_character(gguf_tokenizer.decode(ids[:n]), ids[:n]) == expected


def test_a_real_replacement_character_is_kept(gguf_tokenizer):
    ids = gguf_tokenizer.encode("x\ufffd", add_special_tokens=False)
    dec = gguf_tokenizer.incremental_decoder()
    assert "".join(dec.push(i) for i in ids) + dec.finish() == "x\ufffd"


@pytest.mark.parametrize("split", [1, 3, 6])
@pytest.mark.parametrize("text", STREAM_TEXTS[:-1])
def test_text_after_a_prompt_is_the_whole_decode_past_the_prompts(gguf_tokenizer, hf_gguf_tokenizer, text, split):
    """A completion's text is what decoding prompt + completion adds to the prompt's text (transformers'
    decode is the reference); streamed with the prompt as context, the pieces add up to the same."""
    ids = gguf_tokenizer.encode(text)
    if len(ids) <= split:
        return
    prompt, gen = ids[:split], ids[split:]
    before, whole = hf_gguf_tokenizer.decode(prompt), hf_gguf_tokenizer.decode(ids)
    after = gguf_tokenizer.decode_after(prompt, gen)
    if "\ufffd" not in before:  # a prompt that ends inside a character is decoded apart
        assert after == whole[len(before):]
    dec = gguf_tokenizer.incremental_decoder(context=prompt)
    assert "".join(dec.push(t) for t in gen) + dec.flush() == after


def test_a_sentencepiece_completion_keeps_its_leading_space():
    """SentencePiece's decoder strips the first token's leading space: a completion decoded alone
    would lose the space between the prompt and it."""
    from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "\u2581The": 1, "\u2581capital": 2, "\u2581is": 3, "\u2581Paris": 4, ".": 5}
    backend = Backend(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = Tokenizer(backend)
    prompt, gen = [1, 2, 3], [4, 5]
    assert tok.decode(gen) == "Paris."
    assert tok.decode(prompt) + tok.decode_after(prompt, gen) == tok.decode(prompt + gen) == "The capital is Paris."
    dec = tok.incremental_decoder(context=prompt)
    assert [dec.push(t) for t in gen] == [" Paris", "."]


def test_a_completion_after_a_prompt_ending_inside_a_character_keeps_its_leading_space():
    """A byte-fallback SentencePiece tokenizer (Llama 2's decoders): a prompt whose last token is the
    first byte of a character. The context was dropped whole, so the decoder's strip took the reply's
    leading space ("x" where the whole text reads "Hello\ufffd x"); now only that byte is left out."""
    from tokenizers import Tokenizer as Backend, decoders, models

    vocab = {"<unk>": 0, "\u2581Hello": 1, "\u2581x": 2, "<0xE4>": 3, "<0xB8>": 4, "<0xAD>": 5}
    backend = Backend(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    tok = Tokenizer(backend)
    prompt = [1, 3]
    assert tok.decode(prompt + [2]) == "Hello\ufffd x" and tok.decode([2]) == "x"
    assert tok.decode_after(prompt, [2]) == " x"
    for gen in ([2], [4, 5, 2]):  # the reply that leaves the character cut, or completes it
        dec = tok.incremental_decoder(context=prompt)
        assert "".join(dec.push(t) for t in gen) + dec.flush() == tok.decode_after(prompt, gen)


# ------------------------------------------------------------ from a directory


@pytest.fixture(scope="module")
def hf_dir(hf_gguf_tokenizer, tmp_path_factory):
    """A tokenizer directory as transformers writes it, plus a generation_config."""
    d = tmp_path_factory.mktemp("tok")
    hf_gguf_tokenizer.save_pretrained(d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "bos_token_id": 1}))
    return d


def test_a_special_token_the_tokenizer_has_not_is_undefined_in_its_template(hf_dir, tmp_path):
    """A tokenizer without a BOS or a pad token (Qwen's): transformers leaves the template's variable
    undefined, so `{{ bos_token }}` writes nothing; it wrote "None" into the prompt."""
    import shutil

    transformers = pytest.importorskip("transformers")
    d = shutil.copytree(hf_dir, tmp_path / "t")
    (d / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{{ 'pad:' ~ pad_token if pad_token is defined else 'no pad' }}")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "bos_token": None, "pad_token": None}))
    (d / "special_tokens_map.json").unlink(missing_ok=True)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    reference = transformers.AutoTokenizer.from_pretrained(d)
    assert reference.bos_token is None and reference.pad_token is None
    for messages in CHATS:
        expected = reference.apply_chat_template(messages, tokenize=False)
        assert "None" not in expected and Tokenizer.from_dir(d).apply_chat_template(messages) == expected


def test_from_dir_matches_transformers(hf_dir, hf_gguf_tokenizer, gguf_tokenizer):
    tok = Tokenizer.from_dir(hf_dir)
    for text in TEXTS + DIGIT_AFTER_SPACE:
        ids = tok.encode(text)
        assert ids == hf_gguf_tokenizer.encode(text), text
        assert tok.decode(ids) == hf_gguf_tokenizer.decode(ids)
    assert tok.eos_token_ids == [2, 0]
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    assert tok.chat_template == gguf_tokenizer.chat_template
    for messages in CHATS:
        assert tok.apply_chat_template(messages) == gguf_tokenizer.apply_chat_template(messages)


def test_from_dir_template_in_tokenizer_config(hf_dir, tmp_path):
    import shutil

    d = tmp_path / "t"
    shutil.copytree(hf_dir, d)
    (d / "chat_template.jinja").unlink()
    (d / "generation_config.json").unlink()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D"}]
    cfg["eos_token"] = {"content": "<|endoftext|>", "special": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(d)
    assert tok.apply_chat_template([]) == "<|im_start|>D"
    assert tok.eos_token_ids == [0]


TOOL_USE = ("{{ bos_token }}tools: {% for t in tools %}{{ t.function.name }} {% endfor %}"
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("layout", ["tokenizer_config.json", "additional_chat_templates"])
def test_from_dir_a_tool_use_template_writes_a_prompt_with_tools(hf_dir, tmp_path, layout):
    """A model's named templates, as a list in tokenizer_config.json or (as transformers 5 saves them)
    a file each: given tools, "tool_use" writes the prompt, else the default, as transformers picks
    (and vLLM, which asks transformers; llama.cpp does the same). Only the default was read. Another
    template set in its place replaces them all (vLLM's --chat-template does), and the named ones
    are saved as transformers reads them back."""
    import shutil

    transformers = pytest.importorskip("transformers")
    d = tmp_path / "t"
    shutil.copytree(hf_dir, d)
    default = (d / "chat_template.jinja").read_text()
    if layout == "tokenizer_config.json":
        (d / "chat_template.jinja").unlink()
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = [{"name": "default", "template": default}, {"name": "tool_use", "template": TOOL_USE}]
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    else:
        writer = transformers.AutoTokenizer.from_pretrained(hf_dir)
        writer.chat_template = {"default": default, "tool_use": TOOL_USE}
        writer.save_pretrained(d)
        assert (d / layout / "tool_use.jinja").is_file()
    reference = transformers.AutoTokenizer.from_pretrained(d)
    tok = Tokenizer.from_dir(d)
    for messages in CHATS:
        for tools in (None, WEATHER):
            expected = reference.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
            assert tok.apply_chat_template(messages, tools=tools) == expected
    saved = tmp_path / "saved"
    shutil.copytree(hf_dir, saved)
    (saved / "chat_template.jinja").unlink()
    cfg = json.loads((saved / "tokenizer_config.json").read_text())
    (saved / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=tok.saved_chat_template())))
    assert transformers.AutoTokenizer.from_pretrained(saved).chat_template == reference.chat_template
    tok.chat_template = "{{ messages[0].content }}"
    assert tok.apply_chat_template(CHATS[0], tools=WEATHER) == "What is 2+2?"


def test_from_dir_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


@pytest.fixture(scope="module")
def tiny_tokenizer_json(tmp_path_factory):
    """A byte-level BPE of ten tokens, as `tokenizers` writes it: a tokenizer.json to put bad files beside."""
    from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers

    backend = Backend(models.BPE({c: i for i, c in enumerate(["<s>", "</s>", *"abcdefgh"])}, []))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.ByteLevel(), decoders.ByteLevel()
    path = tmp_path_factory.mktemp("tiny-tok") / "tokenizer.json"
    backend.save(str(path))
    return path


@pytest.mark.parametrize("file, content, says", [
    ("tokenizer.json", "{", r"cannot load \(EOF while parsing"),
    ("tokenizer_config.json", "{", r"not valid JSON"),
    # valid JSON, but not an object: each was an AttributeError from the first .get
    ("tokenizer_config.json", "[1]", r"holds a JSON list, not an object"),
    ("special_tokens_map.json", "null", r"holds a JSON null, not an object"),
    ("generation_config.json", '"eos"', r"holds a JSON str, not an object"),
    # ids that are not ids: were a ValueError from int(), or a list kept as the BOS id
    ("generation_config.json", '{"eos_token_id": ["2"]}', r"eos_token_id is \['2'\]; a token id"),
    ("config.json", '{"eos_token_id": true}', r"eos_token_id is True; a token id"),
    ("config.json", '{"bos_token_id": [1, 2]}', r"bos_token_id is \[1, 2\]; one token id"),
    ("chat_template.jinja", b"{{ '\xff' }}", r"a chat template that is not UTF-8 text"),
    # nested past Python's recursion limit: was a RecursionError, its file not named
    pytest.param("tokenizer_config.json", "[" * 100_000 + "]" * 100_000, r"not valid JSON \(maximum recursion depth",
                 id="tokenizer_config-nested-deep"),
])
def test_a_broken_tokenizer_file_is_named(tiny_tokenizer_json, tmp_path, file, content, says):
    (tmp_path / "tokenizer.json").write_bytes(tiny_tokenizer_json.read_bytes())
    (tmp_path / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(TokenizerError, match=rf"^{tmp_path / file}: " + says):
        Tokenizer.from_dir(tmp_path)


def test_a_generation_config_value_no_request_takes_is_left_out_with_a_warning(tiny_tokenizer_json, tmp_path):
    # each was taken, and every request that left the field out was refused (400) for a value it had not sent
    from linnet.serve.openai_api import sampling_request

    (tmp_path / "tokenizer.json").write_bytes(tiny_tokenizer_json.read_bytes())
    (tmp_path / "generation_config.json").write_text(
        '{"temperature": -1, "top_k": 0.5, "min_p": Infinity, "max_new_tokens": 0, "top_p": 0.9, "repetition_penalty": null}')
    with pytest.warns(UserWarning) as caught:
        tok = Tokenizer.from_dir(tmp_path)
    assert tok.sampling_defaults == {"top_p": 0.9}
    said = [str(w.message) for w in caught]
    where = tmp_path / "generation_config.json"
    assert f"{where}: temperature is -1, not between 0 and 1e+30; requests that leave temperature out take the " \
           "API's default" in said
    assert f"{where}: top_k is 0.5, not a whole number; requests that leave top_k out take the API's default" in said
    assert f"{where}: min_p is Infinity, not a number; requests that leave min_p out take the API's default" in said
    assert f"{where}: max_new_tokens is 0, not 1 or more; requests that leave max_tokens out take the API's default" in said
    assert len(said) == 4  # (a null is none, as before, without a word)
    request = sampling_request({}, [1, 2], 16, None, defaults=tok.sampling_defaults)
    assert (request.temperature, request.top_p, request.top_k, request.min_p) == (1.0, 0.9, 0, 0.0)  # OpenAI's, but top_p


def test_a_bos_id_in_a_list_of_one_is_that_id(tiny_tokenizer_json, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(tiny_tokenizer_json.read_bytes())
    (tmp_path / "config.json").write_text('{"bos_token_id": [0], "eos_token_id": 1}')
    assert Tokenizer.from_dir(tmp_path).bos_token_id == 0


def test_no_chat_template(hf_dir, tmp_path):
    tok = Tokenizer.from_dir(hf_dir)
    tok.chat_template = None
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_a_long_text_encodes_as_a_short_one_does(gguf_tokenizer):
    # past RELEASE_GIL_FROM characters `encode` goes through the batch path, which lets go of the GIL
    from linnet.nest.tokenizer import RELEASE_GIL_FROM

    text = "<|im_start|>user\nnaïve café 12345, spaced  out\n<|im_end|>" * (RELEASE_GIL_FROM // 40)
    assert len(text) >= RELEASE_GIL_FROM
    for special in (True, False):
        assert gguf_tokenizer.encode(text, special) == gguf_tokenizer.backend.encode(text, add_special_tokens=special).ids


@pytest.mark.parametrize("text", ["a\ud800b", "emoji 😀 then \udcff", "x" * (1 << 14) + "\udfff", "caf\udce9"])
def test_a_lone_surrogate_is_named_where_utf_8_refuses_it(gguf_tokenizer, text):
    """A str may hold a lone surrogate (JSON's "\\ud800", a command line's bytes that are not UTF-8),
    which has no UTF-8 bytes: the error names it where Python's own codec does, and the byte that
    Python's surrogateescape stands it for (it was a TypeError from tokenizers, 'TextInputSequence
    must be str', and a server's 500)."""
    with pytest.raises(UnicodeEncodeError) as codec:
        text.encode("utf-8")
    at = codec.value.start
    with pytest.raises(TokenizerError, match=f"lone surrogate, U\\+{ord(text[at]):04X}.*, at character {at}:") as err:
        gguf_tokenizer.encode(text)
    try:
        byte = text[at].encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # not one that stands for a byte
        assert "stand-in" not in str(err.value)
    else:
        assert f"the byte 0x{byte[0]:02X}" in str(err.value)


def test_a_generation_configs_sampling_settings_are_a_requests_defaults(hf_dir, tmp_path):
    """As vLLM's --generation-config auto: the fields a body leaves out (or sends as null) take the
    config's (max_new_tokens as max_tokens); those it sends keep theirs; a config's null is no default."""
    import shutil

    from linnet.serve.openai_api import completion_job

    d = tmp_path / "t"
    shutil.copytree(hf_dir, d)
    (d / "generation_config.json").write_text(json.dumps({
        "eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": None,
        "repetition_penalty": 1.05, "max_new_tokens": 7}))
    tok = Tokenizer.from_dir(d)
    assert tok.sampling_defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
                                     "max_tokens": 7}
    (req,) = completion_job({"prompt": "hi"}, tok, 64).requests
    assert (req.temperature, req.top_p, req.top_k, req.min_p, req.repetition_penalty, req.max_new_tokens) == \
        (0.6, 0.9, 20, 0.0, 1.05, 7)
    (req,) = completion_job({"prompt": "hi", "temperature": 0, "top_p": None, "max_tokens": 12}, tok, 64).requests
    assert (req.temperature, req.top_p, req.max_new_tokens) == (0.0, 0.9, 12)
    assert Tokenizer.from_dir(hf_dir).sampling_defaults == {}  # a config without them: the API's own
