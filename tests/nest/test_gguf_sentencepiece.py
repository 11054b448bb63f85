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


def _spelled(tokens, ids) -> bytes:
    """The bytes `ids` spell in a SentencePiece vocabulary, worked out by hand: <0xNN> is its byte, "▁"
    a space, a control token nothing; less the one space SentencePiece put before the text."""
    out = b"".join(bytes([int(t[3:5], 16)]) if t.startswith("<0x") else b"" if t in ("<s>", "</s>")
                   else t.replace("▁", " ").encode() for t in (tokens[i] for i in ids))
    return out[1:] if out.startswith(b" ") else out


def test_bad_byte_runs_decode_as_utf8_replace_does_whole_and_streamed(spm_vocabulary, spm_gguf):
    """A run of byte tokens that is not UTF-8 (a lead byte cut short, a stray continuation byte)
    reads with one U+FFFD for each bad sequence, as Python's decode("utf-8", "replace") reads
    llama.cpp's bytes; a stream token by token adds up to it. `tokenizers`' ByteFallback wrote a
    U+FFFD for every byte of such a run: [<0xC3> <0xA9> <0x80>] ("é", a stray byte) was "���",
    and streamed after the "é" had gone out, "é��"."""
    from hypothesis import given, settings, strategies as st

    try:
        import llama_cpp
    except ImportError:  # (the bytes worked out by hand are the reference still)
        llama_cpp = None
    tokens = spm_vocabulary[0]
    ours = Tokenizer.from_gguf(spm_gguf)
    llm = llama_cpp and llama_cpp.Llama(model_path=str(spm_gguf), vocab_only=True, verbose=False)
    first, last = tokens.index("▁the"), len(tokens) - 1
    byte = lambda b: tokens.index(f"<0x{b:02X}>")
    # bytes that begin a character, continue one, or are one
    some_bytes = st.sampled_from([byte(b) for b in (0x41, 0x80, 0x81, 0xA9, 0xBF, 0xC3, 0xE3, 0xF0, 0x9F, 0xFF)])
    token = st.one_of(some_bytes, some_bytes, st.integers(259, last), st.just(2))

    assert ours.decode([first, byte(0xC3), byte(0xA9), byte(0x80)]) == "theé\ufffd"

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(st.lists(token, max_size=12))
    def check(rest):
        ids = [1, first, *rest]  # (llama-cpp-python strips the leading space after a BOS alone)
        whole = ours.decode(ids, skip_special_tokens=True)
        assert whole == _spelled(tokens, ids).decode("utf-8", "replace")
        assert llm is None or whole == llm.detokenize(ids).decode("utf-8", "replace")
        decoder = ours.incremental_decoder(skip_special_tokens=True)
        assert "".join(decoder.stream(ids)) == whole

    check()


def _tied_vocabulary():
    """<unk> <s> </s>, the 256 bytes, "▁abcd", and four pieces all scored alike, in an id order that
    is no text's left-to-right order: "cd" < "bc" < "ab" < "da" < "cd" around the cycle."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("▁abcd") + ["cd", "bc", "ab", "da"]
    types = [2, 3, 3] + [6] * 256 + [1] * 9
    return tokens, types, [0.0] * 259 + [-1000.0] * 5 + [-5.0] * 4


def test_pieces_tied_on_score_merge_leftmost_first_as_llama_cpp_does(spm_vocabulary, write_spm_gguf, tmp_path):
    """Of pairs whose joins score the same, llama.cpp (and SentencePiece) merge the leftmost first;
    Linnet's merges, ranked apart, broke the tie by token id: "dab" was ["▁", "d", "ab"], llama.cpp's
    ["▁", "da", "b"]. A converter that writes one score for every token (gguf's LlamaHfVocab writes
    -1000) ties every merge."""
    from hypothesis import given, settings, strategies as st

    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_spm_gguf(tmp_path / "tied.gguf", *_tied_vocabulary())
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    pieces = lambda text: [ours.id_to_token(i) for i in ours.encode(text, add_special_tokens=False)]
    assert pieces("dab") == ["▁", "da", "b"]  # "da" is left of "ab"
    assert pieces("abcda") == ["▁", "ab", "cd", "a"]  # "ab" first, then "cd" (left of "da")

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(st.text(st.sampled_from("abcd x"), max_size=12), st.booleans())
    def check(text, special):
        text = text + "</s>" + text[::-1] if special else text
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True)

    check()
    # the learned vocabulary with every piece's score -1000, as LlamaHfVocab writes it
    tokens, types, scores = spm_vocabulary
    path = write_spm_gguf(tmp_path / "flat.gguf", tokens, types, [-1000.0] * len(tokens))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    for text in TEXTS:
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_ties_no_merge_makes_keep_the_backends_merges(spm_vocabulary, spm_gguf, write_spm_gguf, tmp_path):
    """Only a vocabulary whose ties merges can meet is merged again in Python: not a learned one (its
    scores apart), nor one whose pieces of one score no merge makes, as Gemma's: runs of spaces as
    user-defined pieces (the text's spaces are "▁" before any merge) and <unused0>, <unused1>."""
    llama_cpp = pytest.importorskip("llama_cpp")
    assert Tokenizer.from_gguf(spm_gguf).merger is None
    tokens, types, scores = spm_vocabulary
    extra = ["  ", "   ", "<unused0>", "<unused1>"]
    path = write_spm_gguf(tmp_path / "gemma-like.gguf", tokens + extra, types + [4, 4, 3, 3], scores + [0.0] * 4)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert ours.merger is None
    for text in TEXTS + ["a    b<unused1>", "\tthe  fox   "]:
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_a_character_with_no_token_of_its_own_still_merges_as_llama_cpp_merges_it(write_spm_gguf, tmp_path):
    """llama.cpp's symbols start as characters, tokens or not, so "▁" merges into "▁a" where "▁" is
    no token; Linnet's BPE spelled it in bytes before any merge: "ab ab" was [<0xE2> <0x96> <0x81> a
    b] twice over, llama.cpp's ["▁ab", "▁ab"]."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("abcd") + ["▁a", "▁ab", "cd"]
    types = [2, 3, 3] + [6] * 256 + [1] * 7
    path = write_spm_gguf(tmp_path / "open.gguf", tokens, types, [0.0] * 259 + [-1000.0] * 4 + [-1.0, -2.0, -3.0])
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert [ours.id_to_token(i) for i in ours.encode("ab ab", add_special_tokens=False)] == ["▁ab", "▁ab"]
    for text in ("ab ab", "abcd  a", " dab😀a", "x</s>ab c"):
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_runs_of_spaces_scored_alike_merge_as_llama_cpp_merges_them(write_spm_gguf, tmp_path):
    """Pieces for runs of 2 to 8 spaces all scored 0 (user-defined pieces score so): llama.cpp
    grows a run from its left, ranked merges paired the spaces first; eight spaces were
    ["▁▁▁▁", "▁▁▁▁▁"], llama.cpp's ["▁▁▁▁▁▁▁▁", "▁"] (the dummy prefix is the ninth)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    runs = ["▁" * k for k in range(2, 9)]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("▁abc") + runs + ["▁a", "ab", "▁ab"]
    types = [2, 3, 3] + [6] * 256 + [1] * 4 + [4] * len(runs) + [1] * 3
    scores = [0.0] * 259 + [-1000.0] * 4 + [0.0] * len(runs) + [-1.0, -2.0, -3.0]
    path = write_spm_gguf(tmp_path / "runs.gguf", tokens, types, scores)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert [ours.id_to_token(i) for i in ours.encode(" " * 8, add_special_tokens=False)] == ["▁" * 8, "▁"]
    for k in range(1, 20):
        for text in (" " * k, "a" + " " * k + "b", " " * k + "ab"):
            assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_added_tokens_that_overlap_are_taken_longest_first_as_llama_cpp_takes_them(write_spm_gguf, tmp_path):
    """llama.cpp takes a text's added tokens longest first, each wherever it occurs in what longer ones
    left (of one length, by id); `tokenizers` takes the leftmost: with "ab" and "bcd" added, "abcd" was
    ["▁", ..., "ab", "▁", "c", "d"], llama.cpp's ["▁", "a", "bcd"]."""
    from hypothesis import given, settings, strategies as st

    llama_cpp = pytest.importorskip("llama_cpp")
    added = ["<|a|>", "<|a|>b", "ab", "bc", "bcd", "d<|"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("▁abcd<|>") + ["▁a", "cd"] + added
    types = [2, 3, 3] + [6] * 256 + [1] * 10 + [3, 3, 3, 4, 4, 3]
    scores = [0.0] * 259 + [-1000.0] * 8 + [-1.0, -2.0] + [0.0] * len(added)
    path = write_spm_gguf(tmp_path / "overlap.gguf", tokens, types, scores)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert [tokens[i] for i in ours.encode("abcd", add_special_tokens=False)] == ["▁a", "bcd"]
    assert [tokens[i] for i in ours.encode("abc")] == ["<s>", "ab", "▁", "c"]  # "ab", "bc" alike: the first id

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(st.lists(st.sampled_from(["a", "b", "c", "d", " ", "é", "<|", "a|>", "<|a|>", "</s>"]), max_size=10),
           st.booleans())
    def check(pieces, bos):
        text = "".join(pieces)
        assert ours.encode(text, add_special_tokens=bos) == llm.tokenize(text.encode(), add_bos=bos, special=True)

    check()


def test_an_end_token_of_another_type_is_a_control_token_as_llama_cpp_makes_it(write_spm_gguf, tmp_path):
    """llama.cpp takes a token of an end text it knows ("<|im_end|>") for a control token whatever type
    the file gives it; Linnet took the file's word: "a<|im_end|>b" was "a", ten byte tokens and "b",
    llama.cpp's ["▁", "a", "<|im_end|>", "▁", "b"]."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list("▁ab") + ["<|im_end|>", "<|eot_id|>"]
    types = [2, 3, 3] + [6] * 256 + [1] * 4 + [4]
    path = write_spm_gguf(tmp_path / "ends.gguf", tokens, types, [0.0] * 259 + [-1.0] * 5)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert [tokens[i] for i in ours.encode("a<|im_end|>b", add_special_tokens=False)] == ["▁", "a", "<|im_end|>", "▁", "b"]
    for text in ("a<|im_end|>b", "<|eot_id|>a <|im_end|>", "b<|im_end|"):
        ids = ours.encode(text)
        assert ids == llm.tokenize(text.encode(), add_bos=True, special=True), text
        assert ours.decode(ids, skip_special_tokens=True) == llm.detokenize(ids).decode(), text


# Phi-3-mini-4k-instruct's chat template (its tokenizer_config.json's, from memory)
PHI3_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
                 "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
                 "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
                 "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
                 "{% endif %}")


def test_a_phi_3_strips_the_whitespace_after_its_chat_tokens_as_llama_cpp_does(spm_vocabulary, write_spm_gguf,
                                                                                 tmp_path):
    """llama.cpp strips the ASCII whitespace after every added token but <unk>, <s> and <|endoftext|> of a
    model whose general.name holds "phi-3" or "phi3" (llama-vocab.cpp's LLAMA_TOKEN_ATTR_RSTRIP by name), as
    Phi-3's tokenizer.json gives those tokens rstrip: Linnet kept it, so its chat prompt
    "<|user|>\\nthe fox<|end|>\\n<|assistant|>\\n" was [<s>, <|user|>, ▁, <0x0A>, the, ...], llama.cpp's
    [<s>, <|user|>, ▁the, ▁fox, <|end|>, <|assistant|>]. Unicode's other whitespace (U+00A0) it keeps,
    which `tokenizers`' rstrip would not."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    tokens, types, scores = spm_vocabulary
    chat = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>", "<|placeholder1|>"]
    tokens, types, scores = tokens + chat, types + [3] * 5 + [4], scores + [0.0] * 6
    texts = ["<|user|>\nthe fox<|end|>\n<|assistant|>\n", "<|system|> \t\r\n the dog \n<|end|>  \n<|user|>\x0b\x0cfox",
             "a </s>  b<s>  c <unk> d<|endoftext|>\n e", "<|user|>\u00a0\nfox<|end|> \u3000 <|assistant|>\u2028 x",
             "dog<|placeholder1|>\n\nfox \n", "<|end|>\x1cthe\n\n"]
    messages = [{"role": "system", "content": "the lazy dog"}, {"role": "user", "content": "the quick fox?"},
                {"role": "assistant", "content": " the brown fox\n"}, {"role": "user", "content": "\u00a0runs"}]
    for name, strips in (("Phi-3 Mini 4k Instruct", True), ("phi3", True), ("Phi 3 Mini", False), (None, False)):
        path = write_spm_gguf(tmp_path / f"{name}.gguf", tokens, types, scores, name=name)
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        ours = Tokenizer.from_gguf(path)
        # as Phi-3's tokenizer.json has them (rstrip true but for these three)
        kept = {t.content for t in ours.backend.get_added_tokens_decoder().values() if not t.rstrip}
        assert kept == ({"<unk>", "<s>", "<|endoftext|>"} if strips else {"<unk>", "<s>", "</s>", *chat})
        pieces = [tokens[i] for i in ours.encode(texts[0])]
        assert (pieces == ["<s>", "<|user|>", "▁the", "▁fox", "<|end|>", "<|assistant|>"]) == strips, name
        for text in texts:
            ids = ours.encode(text)
            assert ids == llm.tokenize(text.encode(), add_bos=True, special=True), (name, text)
            assert ours.decode(ids, skip_special_tokens=True) == llm.detokenize(ids).decode(), (name, text)
        # the chat template rendered, and its prompt encoded, as llama-cpp-python renders and encodes it
        prompt = Jinja2ChatFormatter(PHI3_TEMPLATE, eos_token="</s>", bos_token="<s>")(messages=messages).prompt
        assert Tokenizer.from_gguf(path).apply_chat_template(messages, template=PHI3_TEMPLATE) == prompt
        assert ours.encode(prompt) == llm.tokenize(prompt.encode(), add_bos=True, special=True), name
