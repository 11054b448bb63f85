"""Building a tokenizer from GGUF metadata, on small GGUFs written here."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from linnet.nest.errors import TokenizerError  # noqa: E402
from linnet.nest.gguf_tokenizer import (  # noqa: E402
    END_OF_GENERATION, PRE_TOKENIZERS, _pre_tokenizer, byte_alphabet)
from linnet.nest.tokenizer import Tokenizer  # noqa: E402

CONTROL, USER_DEFINED, NORMAL = 3, 4, 1


TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"


def write_tokenizer_gguf(path, *, model="gpt2", pre="smollm", add_bos=True, control=(), eot="<eot>", template=TEMPLATE,
                         merges=()):
    """A byte-level vocabulary with <s> BOS, </s> EOS and `eot` EOT; `control` adds control tokens
    after the normal ones; `template`: the chat template, or named ones as gguf's writer takes them;
    `add_bos` None: no add_bos_token key; `merges`: more merges, each one's join a token of its own;
    `pre` None: no tokenizer.ggml.pre key."""
    alphabet = list(byte_alphabet().values())
    merges = ["h e", "l l", "he ll", "Ġ w", "o r", *merges]
    joined = list(dict.fromkeys(m.replace(" ", "") for m in merges))
    tokens = ["<s>", "</s>", "<eot>", "<think>"] + alphabet + joined + list(control)
    types = [CONTROL, CONTROL, CONTROL, USER_DEFINED] + [NORMAL] * (len(tokens) - 4 - len(control))
    types += [CONTROL] * len(control)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_eot_token_id(tokens.index(eot))
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(template)
    w.add_tensor("dummy", np.zeros(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


def test_small_gguf_tokenizer(tmp_path):
    tokens = write_tokenizer_gguf(tmp_path / "t.gguf")
    tok = Tokenizer.from_gguf(tmp_path / "t.gguf")
    ids = tok.encode("hello world<think>é")
    assert ids[0] == 0  # add_bos_token: the BOS is prepended
    pieces = [tokens[i] for i in ids]
    assert pieces == ["<s>", "hell", "o", "Ġw", "or", "l", "d", "<think>", "Ã", "©"]
    assert tok.decode(ids) == "<s>hello world<think>é"
    assert tok.decode(ids, skip_special_tokens=True) == "hello world<think>é"  # user-defined stays
    assert tok.encode("hi", add_special_tokens=False)[0] != 0
    assert tok.eos_token_ids == [1, 2]  # EOS and EOT both stop generation
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<s>x</s>"


def test_ends_known_by_their_text_stop_too(tmp_path):
    """As llama.cpp: a chat's end token stops generation by its text, named by the file or not."""
    tokens = write_tokenizer_gguf(tmp_path / "t.gguf", control=["<|im_end|>", "<|end|>", "<|endoftext|>"])
    ends = [tokens.index(t) for t in ("<|im_end|>", "<|end|>", "<|endoftext|>")]
    assert sorted(Tokenizer.from_gguf(tmp_path / "t.gguf").eos_token_ids) == sorted([1, 2] + ends)


# the texts llama.cpp ends on, less those its rules below make plain tokens (and <fim_prefix>, a
# fill-in-the-middle token it does not end on)
PLAIN_ENDS = sorted(END_OF_GENERATION - {"</s>", "<|end|>", "<|return|>", "<|call|>", "<|calls|>", "<|flush|>",
                                         "<|tool_response>"}) + ["<fim_prefix>"]


@pytest.mark.parametrize("control, fim", [
    (PLAIN_ENDS, {}),
    (["<|end|>", "<|return|>", "<|call|>"], {}),  # gpt-oss's harmony: <|end|> is no end
    (["<|end|>", "<|calls|>", "<|flush|>"], {}),  # Solar Open's: nor is it here
    (["<|end|>", "<|return|>"], {}),
    (["<|tool_response>", "<turn|>"], {}),  # Gemma 4's: its </s> (the EOS here) is a plain token
    (["<pad>", "<rep>"], {"fim_pad": "<pad>", "fim_rep": "<rep>", "fim_sep": "<think>"}),
])
def test_generation_ends_where_llama_cpp_ends_it(control, fim, tmp_path, monkeypatch):
    """llama.cpp ends generation on the file's EOS, EOT and EOM, on the tokens it knows by their text,
    and on the fill-in-the-middle padding, repository and file separator tokens the file names.
    Linnet knew fewer texts (</s>, [EOT], <eos>, ...) and no FIM key."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokens = write_tokenizer_gguf(tmp_path / "t.gguf", control=control)
    add = gguf.GGUFWriter.add_eos_token_id
    monkeypatch.setattr(gguf.GGUFWriter, "add_eos_token_id", lambda w, i: (add(w, i), *(
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", tokens.index(text)) for key, text in fim.items())))
    write_tokenizer_gguf(tmp_path / "t.gguf", control=control)
    llm = llama_cpp.Llama(model_path=str(tmp_path / "t.gguf"), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    ends = [i for i in range(len(tokens)) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    assert sorted(Tokenizer.from_gguf(tmp_path / "t.gguf").eos_token_ids) == ends


def test_harmony_does_not_stop_at_the_end_of_a_message(tmp_path):
    """gpt-oss's harmony format ends every message with <|end|>, the reasoning before the answer
    too; the reply ends at <|return|> or <|call|> (its generation_config, llama.cpp's rule)."""
    harmony = ["<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"]
    tokens = write_tokenizer_gguf(tmp_path / "t.gguf", control=harmony)
    stops = Tokenizer.from_gguf(tmp_path / "t.gguf").eos_token_ids
    assert tokens.index("<|end|>") not in stops
    assert {tokens.index(t) for t in ("<|return|>", "<|call|>", "<|endoftext|>")} <= set(stops)
    # even where a key names it, as llama.cpp drops it from the whole set
    tokens = write_tokenizer_gguf(tmp_path / "k.gguf", control=harmony, eot="<|end|>")
    assert tokens.index("<|end|>") not in Tokenizer.from_gguf(tmp_path / "k.gguf").eos_token_ids


def test_a_tool_use_template_writes_a_prompt_with_tools(tmp_path):
    """llama.cpp's converter writes a model's named templates as tokenizer.chat_template.NAME, listed
    in tokenizer.chat_templates; given tools, llama.cpp's server writes the prompt with "tool_use",
    as transformers (and vLLM) pick it. Only the default was read. Saved, the named ones are the
    same keys again."""
    transformers = pytest.importorskip("transformers")
    tool_use = "{{ bos_token }}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{{ messages[-1].content }}"
    named = [{"name": "default", "template": TEMPLATE}, {"name": "tool_use", "template": tool_use}]
    write_tokenizer_gguf(tmp_path / "t.gguf", template=named)
    tok = Tokenizer.from_gguf(tmp_path / "t.gguf")
    reference = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend, bos_token="<s>", eos_token="</s>")
    reference.chat_template = {t["name"]: t["template"] for t in named}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hello"}]
    for given in (None, tools):
        assert tok.apply_chat_template(messages, tools=given) == reference.apply_chat_template(
            messages, tools=given, tokenize=False, add_generation_prompt=True)
    write_tokenizer_gguf(tmp_path / "saved.gguf", template=tok.saved_chat_template())
    fields = gguf.GGUFReader(tmp_path / "saved.gguf").fields
    text = lambda key: fields[key].contents()
    assert (text("tokenizer.chat_template"), text("tokenizer.chat_template.tool_use")) == (TEMPLATE, tool_use)
    assert text("tokenizer.chat_templates") == ["tool_use"]


# the names llama.cpp reads (it refuses "gpt2" and "minerva", which Linnet takes as GPT-2's and StarCoder's;
# Minerva's GGUFs say "minerva-7b", which Linnet refused)
LLAMA_CPP_PRE = sorted(set(PRE_TOKENIZERS) - {"gpt2", "minerva"} | {"minerva-7b"})


@pytest.mark.parametrize("pre", LLAMA_CPP_PRE)
def test_a_file_that_does_not_say_whether_to_add_a_bos_adds_one_where_llama_cpp_does(pre, tmp_path):
    """Without tokenizer.ggml.add_bos_token, llama.cpp adds a BOS for Llama 3's and Falcon 3's
    pre-tokenizers and for no other byte-level one; Linnet added none for any."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / f"{pre}.gguf"
    write_tokenizer_gguf(path, pre=pre, add_bos=None)
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    for text in ("hello world", "<s>hello", " or"):
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), (pre, text)


@pytest.mark.parametrize("pre", ["default", None])
def test_the_default_pre_tokenizer_splits_as_llama_cpps(pre, tmp_path):
    """llama.cpp's "default" splitting, a file's with no tokenizer.ggml.pre too (GGUFs written before
    the key was): runs of punctuation are split off first, and runs of digits from the space before
    them, in threes. Linnet split as GPT-2's regex alone: "x ." was ["x", "Ġ."], llama.cpp's
    ["x", "Ġ", "."]."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / "default.gguf"
    write_tokenizer_gguf(path, pre=pre, merges=["Ġ .", "Ġ 1", "Ġ $", "' s", "Ġ '", "1 2", "12 3", "Ġ1 2", "Ċ Ċ"])
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    for text in ("x .", "it's", "q $5", "a 12345 b", "x  .y", "a <= b", "/\n\n+", "don't!! 1", "¿x — y, «z»?"):
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_a_bos_to_add_past_the_vocabulary_is_named(tmp_path, monkeypatch):
    tokens = write_tokenizer_gguf(tmp_path / "ok.gguf")
    monkeypatch.setattr(gguf.GGUFWriter, "add_bos_token_id", lambda w, _: w.add_uint32("tokenizer.ggml.bos_token_id",
                                                                                        len(tokens)))
    write_tokenizer_gguf(tmp_path / "bad.gguf")
    with pytest.raises(TokenizerError, match=rf"bad\.gguf: tokenizer.ggml.bos_token_id is {len(tokens)}, but the "
                                             rf"vocabulary has {len(tokens)} tokens"):
        Tokenizer.from_gguf(tmp_path / "bad.gguf")  # was an IndexError
    write_tokenizer_gguf(tmp_path / "unused.gguf", add_bos=False)  # an id never added is no error
    assert Tokenizer.from_gguf(tmp_path / "unused.gguf").encode("hello") == \
        Tokenizer.from_gguf(tmp_path / "ok.gguf").encode("hello")[1:]


@pytest.mark.parametrize("method, value, says", [
    ("add_token_types", lambda tokens: tokens[:5],
     r"tokenizer.ggml.token_type is an array of 5, not one integer for each of the \d+ tokens"),  # was a BPE error
    ("add_token_list", lambda tokens: 7, r"tokenizer.ggml.tokens is 7, not an array of strings"),  # was a TypeError
    ("add_token_merges", lambda merges: 7, r"tokenizer.ggml.merges is 7, not an array of strings"),
])
def test_a_tokenizer_array_of_another_kind_is_named(tmp_path, monkeypatch, method, value, says):
    key = {"add_token_types": "tokenizer.ggml.token_type", "add_token_list": "tokenizer.ggml.tokens",
           "add_token_merges": "tokenizer.ggml.merges"}[method]
    monkeypatch.setattr(gguf.GGUFWriter, method, lambda w, tokens: w.add_key_value(
        key, value(tokens), gguf.GGUFValueType.get_type(value(tokens)),
        gguf.GGUFValueType.UINT32 if isinstance(value(tokens), list) else None))
    write_tokenizer_gguf(tmp_path / "bad.gguf")
    with pytest.raises(TokenizerError, match=rf"bad\.gguf: {says}$"):
        Tokenizer.from_gguf(tmp_path / "bad.gguf")


def test_merges_that_never_apply_are_left_out_as_llama_cpp_leaves_them(tmp_path, monkeypatch):
    """A merge without its space (a TypeError in tokenizers), of a token not in the vocabulary (an
    exception), or whose join is not one (a Rust panic, which `except Exception` does not catch):
    llama.cpp loads the file and tokenizes as without them."""
    llama_cpp = pytest.importorskip("llama_cpp")
    add = gguf.GGUFWriter.add_token_merges
    monkeypatch.setattr(gguf.GGUFWriter, "add_token_merges", lambda w, merges: add(w, ["x", "nosuch pair", "h o",
                                                                                      *merges]))
    write_tokenizer_gguf(tmp_path / "odd.gguf")
    llm = llama_cpp.Llama(model_path=str(tmp_path / "odd.gguf"), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(tmp_path / "odd.gguf")
    for text in ("hello world", "ho hum", "x nosuchpair"):
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_a_merge_listed_twice_ranks_where_it_is_first_listed(tmp_path):
    """llama.cpp ranks a merge the file lists twice by its first place; `tokenizers` took the last:
    with "o r" before "w o" and again after, "wor" was ["wor"], llama.cpp's ["w", "or"]."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / "twice.gguf"
    write_tokenizer_gguf(path, merges=["w o", "wo r", "o r"])
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ours = Tokenizer.from_gguf(path)
    assert [ours.id_to_token(i) for i in ours.encode("wor", add_special_tokens=False)] == ["w", "or"]
    for text in ("wor", " world", "word or"):
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=True, special=True), text


def test_added_tokens_that_overlap_are_taken_as_llama_cpp_takes_them(tmp_path):
    """Longest first (llama.cpp's order), not leftmost: with "<think>" (user-defined) and "nk>hello"
    added, "<think>hello" was ["<think>", "hell", "o"], llama.cpp's ["<", "t", "h", "i", "nk>hello"]."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tokens = write_tokenizer_gguf(tmp_path / "t.gguf", control=("nk>hello", "<th"))
    llm = llama_cpp.Llama(model_path=str(tmp_path / "t.gguf"), vocab_only=True, verbose=False)
    tok = Tokenizer.from_gguf(tmp_path / "t.gguf")
    assert [tokens[i] for i in tok.encode("<think>hello", add_special_tokens=False)] == ["<th", "i", "nk>hello"]
    for text in ("<think>hello", "x<think>hello world<think>", "<think>hell", "<thi<think>hellonk>hello"):
        for bos in (True, False):
            assert tok.encode(text, add_special_tokens=bos) == llm.tokenize(text.encode(), add_bos=bos, special=True)


def test_unsupported_model_is_named(tmp_path):
    write_tokenizer_gguf(tmp_path / "bert.gguf", model="bert")
    with pytest.raises(TokenizerError, match=r"bert\.gguf: .*'bert' is not supported"):
        Tokenizer.from_gguf(tmp_path / "bert.gguf")


def test_unknown_pre_tokenizer(tmp_path):
    write_tokenizer_gguf(tmp_path / "p.gguf", pre="no-such-pre")
    with pytest.raises(TokenizerError, match="'no-such-pre' is not supported"):
        Tokenizer.from_gguf(tmp_path / "p.gguf")


def split(pre, text):
    return [piece for piece, _ in _pre_tokenizer(pre).pre_tokenize_str(text)]


def test_pre_tokenizer_table():
    text = "Hello  world 12345\n\n ok"
    for name in PRE_TOKENIZERS:  # every entry builds and loses nothing
        pieces = split(name, text)
        assert "".join(pieces) == "".join(byte_alphabet()[b] for b in text.encode())
    assert split("smollm", "a  12") == ["a", "ĠĠ", "1", "2"]
    assert split("gpt2", "a  12") == ["a", "Ġ", "Ġ12"]
    # llama.cpp's default: punctuation first, then GPT-2's regex, digits apart from their space, in threes
    assert split("default", "it's 12345 x .") == ["it", "'", "s", "Ġ", "123", "45", "Ġx", "Ġ", "."]
    assert split("llama-bpe", "x 12345") == ["x", "Ġ", "123", "45"]
    assert split("qwen2", "x12") == ["x", "1", "2"]
    assert split("gpt-4o", "HelloWorld's") == ["Hello", "World's"]


def test_byte_alphabet():
    alphabet = byte_alphabet()
    assert len(set(alphabet.values())) == 256
    assert alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ" and alphabet[ord("a")] == "a"
