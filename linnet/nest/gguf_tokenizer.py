"""Build a `tokenizers` tokenizer from a GGUF's metadata: byte-level BPE ("gpt2") or
SentencePiece's BPE ("llama": Mistral, Llama 2 and their kin).

A GGUF carries no tokenizer.json: it has the vocabulary
(`tokenizer.ggml.tokens`), the merges (byte-level BPE) or a score per token
(SentencePiece), a type per token, and a *name* for how text is split before
byte-level BPE (`tokenizer.ggml.pre`). llama.cpp gives each name a
list of regexes applied in turn, each one splitting the pieces the previous
one produced; `PRE_TOKENIZERS` below restates those we support as
`tokenizers` pre-tokenizers.

"smollm" (SmolLM/SmolLM2), like "starcoder", first isolates every digit
(\\p{N}) and then applies GPT-2's regex to each piece. That differs from plain
GPT-2 splitting only around whitespace runs before a digit: "a  1" splits as
["a", "  ", "1"] here and as ["a", " ", " 1"] under GPT-2's regex alone.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from typing import TYPE_CHECKING

from .errors import TokenizerError

if TYPE_CHECKING:  # for the annotation alone: each function imports what it uses
    import tokenizers

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a SentencePiece byte token's text, its byte in hex
# Tokens llama.cpp ends generation on by their text, whatever ids the file names (llama-vocab.cpp's
# end-of-generation set, as llama-cpp-python 0.3.36 has it): a GGUF that names only EOS still stops at
# the chat's other ends.
END_OF_GENERATION = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                               "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
                               "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
                               "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["))
# Of those, the ones that end a chat turn (what GGUF's EOT key names), not the whole text
END_OF_TURN = frozenset(("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<EOT>", "_<EOT>",
                         "<end_of_utterance>"))
# GGUF's keys for the ids llama.cpp ends generation on: EOS, EOT and EOM, and its fill-in-the-middle
# padding, repository and file separator tokens
END_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")


def end_of_generation(tokens: list[str], named=()) -> list[int]:
    """The ids llama.cpp ends generation on: those the file `named` (its `END_KEYS`) and those of
    `tokens` it knows by their text. (llama.cpp also takes a token for its FIM padding, repository
    or file separator by its text where no key names one, SmolLM2's <reponame> say; Linnet does
    not, since a GGUF's stops become an exported model's generation_config, which transformers and
    vLLM read.) In gpt-oss's harmony format <|end|> closes every message, the reasoning before the
    answer too, and the reply ends at <|return|> or <|call|>: where both are in the vocabulary (or,
    Solar Open's, <|calls|> and <|flush|>), <|end|> is not a stop, even one a key names (llama.cpp's
    rule for o200k_harmony, and gpt-oss's generation_config); where <|tool_response> is one (Gemma
    4's), </s> is a plain token."""
    stops = [i for i in named if i is not None and 0 <= i < len(tokens)]  # the named first, in their order
    stops += [i for i, t in enumerate(tokens) if t in END_OF_GENERATION]
    dropped = _no_ends({tokens[i] for i in stops})
    return [i for i in dict.fromkeys(stops) if tokens[i] not in dropped]


def _no_ends(texts: set) -> set:
    """Of the end texts `texts` (a vocabulary's), those llama.cpp does not end on (`end_of_generation`)."""
    call = "<|call|>" in texts or "<|calls|>" in texts
    dropped = set()
    if call and ("<|return|>" in texts or "<|flush|>" in texts):
        dropped.add("<|end|>")
    if "<|tool_response>" in texts or "<|plamo:eos|>" in texts:
        dropped.add("</s>")
    return dropped


def llama_cpp_types(tokens: list, types: list) -> list:
    """The token types as llama.cpp takes them: a token of an end text it knows (`END_OF_GENERATION`)
    that the file gives another type is a control one (llama.cpp: "control-looking token ... its type
    will be overridden"), so written in a text it is that token, not its characters'; harmony's <|end|>
    where it is no stop a user-defined one, and where </s> is a plain token (Gemma 4's) it keeps its type."""
    ends = {t for t in tokens if t in END_OF_GENERATION}
    if not ends:
        return types
    dropped = _no_ends(ends)
    promoted = lambda t: USER_DEFINED if t == "<|end|>" and t in dropped else CONTROL  # noqa: E731
    return [promoted(t) if t in ends and k not in (CONTROL, UNKNOWN) and k != promoted(t) and not (
        t == "</s>" and t in dropped) else k for t, k in zip(tokens, types)]


# llama.cpp strips the whitespace after some added tokens by the model's name (llama-vocab.cpp's load(),
# LLAMA_TOKEN_ATTR_RSTRIP, acted on in tokenizer_st_partition): in a file whose general.name holds one of
# these (ASCII case aside), as Phi-3's tokenizer.json gives its chat tokens rstrip
RSTRIP_NAMES = (b"phi-3", b"phi3")  # (bytes: C's tolower lowers ASCII alone)
# of those models' added tokens, the ones it leaves be
RSTRIP_KEPT = frozenset(("<unk>", "<s>", "<|endoftext|>"))
# the tokens it sets those rules of by their text: a file so named whose vocabulary lacks one does not load
RSTRIP_LOOKED_UP = ("</s>", "<unk>", "<s>", "<|endoftext|>")
# what llama.cpp strips (C's isspace): ASCII whitespace, not U+00A0 and the rest `tokenizers` strips too
ASCII_SPACE = " \t\n\v\f\r"


def rstripped(meta, tokens: list, types: list) -> frozenset:
    """The added tokens (of `types` as `llama_cpp_types` gives them) after which llama.cpp strips the
    whitespace of a text: for a model named Phi-3 (`RSTRIP_NAMES`), every control, user-defined and
    unknown one but <unk>, <s> and <|endoftext|>, so "<|user|>\\nHi" is [<|user|>, ▁Hi] (and "</s>",
    which llama.cpp names too, only where it is one of those: a normal token is never matched whole).
    None for any other model. (llama.cpp refuses to load a Phi-3 file lacking one of </s>, <unk>, <s>
    and <|endoftext|>; Linnet takes it.)"""
    if not named_phi3(meta("general.name")):
        return frozenset()
    return frozenset(t for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED, UNKNOWN) and t not in RSTRIP_KEPT)


def named_phi3(name) -> bool:
    """Whether llama.cpp takes a GGUF whose general.name is `name` for a Phi-3's (`RSTRIP_NAMES`)."""
    return isinstance(name, str) and any(n in name.encode().lower() for n in RSTRIP_NAMES)


GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
# llama.cpp's "default" (its name for a file with no tokenizer.ggml.pre too, as GGUFs written before the
# key was): runs of punctuation and a few symbols isolated first, then GPT-2's regex, then runs of digits
# apart from the space before them, in threes
DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")
GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> (regexes applied in turn before byte-level BPE, ignore_merges)
# ignore_merges: a pre-token that is itself in the vocabulary is taken whole
# (llama.cpp does so for llama3's vocabulary, as does its tokenizer.json).
PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {}
for _names, _rule in (
    (("gpt-2", "gpt2", "mpt", "olmo", "jais", "phi-2"), ((GPT2_SPLIT,), False)),
    (("default",), (DEFAULT_SPLITS, False)),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "minerva"),
     ((r"\p{N}", GPT2_SPLIT), False)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), ((LLAMA3_SPLIT,), True)),
    (("qwen2", "deepseek-r1-qwen"), ((QWEN2_SPLIT,), False)),
    (("gpt-4o", "llama4"), ((GPT4O_SPLIT,), False)),
):
    for _name in _names:
        PRE_TOKENIZERS[_name] = _rule


# pre-tokenizers for which llama.cpp adds a BOS where the file has no tokenizer.ggml.add_bos_token
# (Llama 3's and Falcon 3's vocabularies; llama-cpp-python 0.3.36 on each name here)
ADDS_BOS = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3"))


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE.

    Bytes that are printable Latin-1 (and not space) stand for themselves;
    the other 68 are given the characters from U+0100 on, in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    if pre not in PRE_TOKENIZERS:
        raise TokenizerError(
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    regexes, _ = PRE_TOKENIZERS[pre]
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    # The regexes did the splitting; ByteLevel only maps bytes to its alphabet.
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def build_gguf_tokenizer(meta) -> "tuple[tokenizers.Tokenizer, list[int]]":
    """A `tokenizers.Tokenizer` for a GGUF whose tokenizer.ggml.model is "gpt2" or "llama", and the
    token types it was built by (`llama_cpp_types`'s, which `special_splitter` and `rstripped` read too).

    `meta(key, default)` reads GGUF metadata (GGUFCheckpoint.metadata).
    Control and unknown tokens (and end tokens llama.cpp takes as control ones,
    `llama_cpp_types`) become special added tokens (matched whole in
    text, dropped by skip_special_tokens); user-defined ones become plain
    added tokens. A BOS/EOS is added on encode when the GGUF says so
    (tokenizer.ggml.add_bos_token / add_eos_token; when unsaid, llama.cpp's
    defaults: BOS for SentencePiece vocabularies and for byte-level ones of `ADDS_BOS`, else neither).
    """
    kind = meta("tokenizer.ggml.model")
    builders = {"gpt2": _byte_level_bpe, "llama": _sentencepiece_bpe}
    if kind not in builders:
        raise TokenizerError(f"GGUF tokenizer model {kind!r} is not supported; supported: byte-level BPE "
                             f"('gpt2') and SentencePiece BPE ('llama')")
    tokens: list[str] = meta("tokenizer.ggml.tokens") or []
    types: list[int] = meta("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if not tokens:
        raise TokenizerError("the GGUF lacks tokenizer.ggml.tokens")
    # (each was an exception from deep inside: 'int' object is not iterable, or a token out of the BPE's
    # vocabulary where zip() had cut the tokens to the types')
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError(f"tokenizer.ggml.tokens is {_kind(tokens)}, not an array of strings")
    if not isinstance(types, list) or len(types) != len(tokens) or not all(isinstance(k, int) for k in types):
        raise TokenizerError(f"tokenizer.ggml.token_type is {_kind(types)}, not one integer for each of the "
                             f"{len(tokens)} tokens")
    types = llama_cpp_types(tokens, types)
    tk = builders[kind](meta, tokens, types)
    _add_special_tokens(tk, tokens, types, rstripped(meta, tokens, types))
    _add_bos_eos(tk, meta, tokens, default_bos=kind == "llama" or meta("tokenizer.ggml.pre") in ADDS_BOS)
    return tk, types


def _kind(value) -> str:
    """A metadata value as a message names it: an array by its length, anything else by its value."""
    return f"an array of {len(value)}" if isinstance(value, list) else repr(value)


def _byte_level_bpe(meta, tokens: list, types: list):
    from tokenizers import Tokenizer, decoders, models

    merges: list[str] = meta("tokenizer.ggml.merges") or []
    pre = meta("tokenizer.ggml.pre", "default")
    if not merges:
        raise TokenizerError("the GGUF lacks tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise TokenizerError(f"tokenizer.ggml.merges is {_kind(merges)}, not an array of strings")

    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    vocab: dict[str, int] = {}
    for i, (tok, kind_) in enumerate(zip(tokens, types)):
        # A normal token written in plain text (outside the byte alphabet) is
        # respelled; special tokens keep their text, which is what they match.
        if kind_ == NORMAL and not set(tok) <= spelled:
            tok = "".join(alphabet[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    # a merge without its space, or of tokens not in the vocabulary, never applies in llama.cpp (which
    # loads the file); `tokenizers` refuses it (a TypeError, "Token `x` out of vocabulary"): left out
    pairs = [pair for pair in (tuple(m.split(" ", 1)) for m in merges)
             if len(pair) == 2 and pair[0] in vocab and pair[1] in vocab and pair[0] + pair[1] in vocab]
    # a merge listed twice ranks where it is first (llama.cpp keeps the first rank; `tokenizers` the last)
    pairs = list(dict.fromkeys(pairs))
    _, ignore_merges = PRE_TOKENIZERS.get(pre, ((), False))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges, fuse_unk=False))
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    return tk


def _sentencepiece_bpe(meta, tokens: list, types: list):
    """SentencePiece's BPE as llama.cpp runs it: spaces spelled "▁" (one put before the text, and
    after each special token, when tokenizer.ggml.add_space_prefix, the default), then the
    adjacent pair whose join scores highest merged first, bytes with no piece of their own as
    <0xNN> tokens. As `tokenizers` BPE: merges ranked by the score of what they make, byte
    fallback on."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores: list[float] = meta("tokenizer.ggml.scores") or []
    if len(scores) != len(tokens):
        raise TokenizerError("a SentencePiece GGUF needs one tokenizer.ggml.scores entry per token")
    vocab = {t: i for i, t in enumerate(tokens)}
    # llama.cpp joins two pieces wherever their join is a token, of whatever type (a control token
    # made of spaces too), as does transformers' reading of the file
    merges = []
    for token, score in zip(tokens, scores):
        if len(token) > 1:
            for cut in range(1, len(token)):
                left, right = token[:cut], token[cut:]
                if left in vocab and right in vocab:
                    merges.append((-score, vocab[left], vocab[right], left, right))
    merges.sort()
    unknown = next((t for t, k in zip(tokens, types) if k == UNKNOWN), None)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], unk_token=unknown,
                              fuse_unk=True, byte_fallback=True))
    # SentencePiece's dummy prefix, before any leading spaces and after each special token, as
    # llama.cpp (and Mistral's own tokenizer.json) put it; `Metaspace` would skip text already
    # starting with a space.
    prefix = bool(meta("tokenizer.ggml.add_space_prefix", True))
    spaces = [normalizers.Replace(" ", "▁")]
    tk.normalizer = normalizers.Sequence(([normalizers.Prepend("▁")] if prefix else []) + spaces)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tk


def _add_special_tokens(tk, tokens: list, types: list, stripped: frozenset = frozenset()) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain ones; those of
    `stripped` take the whitespace after them (`rstripped`; `tokenizers` strips Unicode's, llama.cpp
    ASCII's alone, which `Tokenizer.encode` mends)."""
    from tokenizers import AddedToken

    special = [AddedToken(t, special=True, normalized=False, rstrip=t in stripped)
               for t, k in zip(tokens, types) if k in (CONTROL, UNKNOWN)]
    plain = [AddedToken(t, special=False, normalized=False, rstrip=t in stripped)
             for t, k in zip(tokens, types) if k == USER_DEFINED]
    if special:
        tk.add_special_tokens(special)
    if plain:
        tk.add_tokens(plain)


def _add_bos_eos(tk, meta, tokens: list, default_bos: bool) -> None:
    from tokenizers import processors

    pieces_single, pieces_pair, used = ["$A:0"], ["$A:0", "$B:1"], []
    for flag, key, front in (("add_bos_token", "bos", True), ("add_eos_token", "eos", False)):
        tid = meta(f"tokenizer.ggml.{key}_token_id")
        if meta(f"tokenizer.ggml.{flag}", default_bos and front) and tid is not None:
            if not 0 <= tid < len(tokens):  # (one never added is left be: Linnet reads no other id by place)
                raise TokenizerError(f"tokenizer.ggml.{key}_token_id is {tid}, but the vocabulary has "
                                     f"{len(tokens)} tokens")
            tok = tokens[tid]
            used.append((tok, tid))
            if front:
                pieces_single.insert(0, f"{tok}:0")
                pieces_pair.insert(0, f"{tok}:0")
            else:
                pieces_single.append(f"{tok}:0")
                pieces_pair.append(f"{tok}:1")
    if used:
        tk.post_processor = processors.TemplateProcessing(
            single=" ".join(pieces_single), pair=" ".join(pieces_pair), special_tokens=used
        )


def special_splitter(tokens: list[str], types: list[int]) -> "SpecialSplitter | None":
    """A `SpecialSplitter` for a GGUF vocabulary in which two added tokens (control, user-defined,
    unknown) can overlap in a text: one holds another, or one ends with what another starts with.
    None where no two can, where `tokenizers`' leftmost-longest matching takes what llama.cpp takes."""
    specials = dict.fromkeys(t for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED, UNKNOWN) and t)
    prefixes = {t[:k] for t in specials for k in range(1, len(t) + 1)}
    overlapping, tails = set(), set()  # tails: a token's ends that begin a longer token
    for token in specials:
        for start in range(len(token)):
            end = start + 1
            while end <= len(token) and token[start:end] in prefixes:
                if token[start:end] in specials and token[start:end] != token:
                    overlapping |= {token, token[start:end]}
                end += 1
            if end > len(token) and start > 0:
                overlapping.add(token)
                tails.add(token[start:])
    overlapping |= {t for t in specials if any(t[:k] in tails for k in range(1, len(t)))}
    return SpecialSplitter(specials, prefixes, overlapping) if overlapping else None


class SpecialSplitter:
    """Where llama.cpp (tokenizer_st_partition) takes a text's added tokens: each token in turn,
    longest first (in UTF-8 bytes; of one length, by id, as libstdc++'s std::sort leaves up to 16
    tokens, past which its order among them is its own), wherever it occurs in what longer ones left.
    `tokenizers` takes the leftmost occurrence, longest there, which differs only where two can
    overlap: with "ab" and "bcd" added, "abcd" was ["ab", "▁", "c", "d"], llama.cpp's ["▁", "a",
    "bcd"]. A text is looked at only around what `tokenizers` took of such tokens (every occurrence
    it did not take overlaps one it took), for a vocabulary where two can overlap (`special_splitter`)."""

    def __init__(self, specials: dict, prefixes: set, overlapping: set):
        self.specials, self.prefixes, self.overlapping = specials, prefixes, overlapping
        order = sorted(specials, key=lambda t: len(t.encode()), reverse=True)  # (stable: ties by id)
        self.rank = {t: r for r, t in enumerate(order)}

    def split(self, text: str, matched: list) -> list | None:
        """llama.cpp's added tokens in `text`, (start, end, token) in order; None where they are
        `matched`, those `tokenizers` took (in the same form). Leftmost matching leaves no occurrence
        starting between two it took, so another starts inside one taken; and llama.cpp takes what
        was taken unless such an occurrence overlaps no taken one it looks for first (then it takes
        that occurrence)."""
        overlapping = [at for at, match in enumerate(matched) if match[2] in self.overlapping]
        if not any(self._outranks(text, matched, at) for at in overlapping):
            return None
        found = set(matched)
        for at in overlapping:
            for start in range(*matched[at][:2]):
                found.update(self._starting(text, start, start))
        taken, used = [], bytearray(len(text))
        for start, end, token in sorted(found, key=lambda o: (self.rank[o[2]], o[0])):
            if not any(used[start:end]):
                used[start:end] = b"\x01" * (end - start)
                taken.append((start, end, token))
        return sorted(taken)

    def _outranks(self, text: str, matched: list, at: int) -> bool:
        """Whether an occurrence starting inside `matched[at]` and running past it overlaps none of
        `matched` that llama.cpp looks for before it. (One that `matched[at]` does not block is as
        long in UTF-8 bytes or longer: in characters, as long in ASCII text, at least a quarter as long.)"""
        first, end, token = matched[at]
        least = len(token.encode()) if text.isascii() else -(-len(token.encode()) // 4)
        return any(not self._blocked(o, matched, at) for start in range(first + 1, end)
                   for o in self._starting(text, start, max(end, start + least - 1)))

    def _blocked(self, occurrence: tuple, matched: list, at: int) -> bool:
        """Whether one of `matched` from `at` on that llama.cpp looks for before `occurrence` overlaps it."""
        key = (self.rank[occurrence[2]], occurrence[0])
        while at < len(matched) and matched[at][0] < occurrence[1]:
            if (self.rank[matched[at][2]], matched[at][0]) < key:
                return True
            at += 1
        return False

    def _starting(self, text: str, at: int, past: int) -> list:
        """The added tokens that occur in `text` at `at` and run past `past`, as (start, end, token)."""
        out, end = [], past + 1
        while end <= len(text) and text[at:end] in self.prefixes:
            if text[at:end] in self.specials:
                out.append((at, end, text[at:end]))
            end += 1
        return out


def sentencepiece_merger(meta) -> "SentencePieceMerger | None":
    """A `SentencePieceMerger` for a SentencePiece GGUF whose pieces the `tokenizers` BPE's ranked
    merges cannot make as llama.cpp does: where two pieces that merges make share a score (a
    converter's placeholder score for every token, as gguf's LlamaHfVocab writes -1000, or one for a
    family of pieces), or where one is made from a character that is no token of its own (the BPE
    spells that character in bytes before any merge). None for any other vocabulary, where ranking
    merges by score is SentencePiece's order."""
    if meta("tokenizer.ggml.model") != "llama":
        return None
    tokens, scores = meta("tokenizer.ggml.tokens") or [], meta("tokenizer.ggml.scores") or []
    if len(scores) != len(tokens):
        return None
    # pieces that share a score, or hold a character that is no token; none holding a space, which
    # the text spells "▁" before any merge (Gemma's runs of spaces are user-defined pieces, matched whole)
    vocab = set(tokens)
    pieces = [(token, score) for token, score in zip(tokens, scores) if len(token) > 1 and " " not in token]
    shared = Counter(score for _, score in pieces)
    missing = set("".join(token for token, _ in pieces)) - vocab
    if len(shared) == len(pieces) and not missing:
        return None  # (a learned vocabulary's: each piece its own score, each character a piece)
    suspects = [(token, score) for token, score in pieces if shared[score] > 1 or not missing.isdisjoint(token)]
    known: dict[str, bool] = {}

    def made(piece: str) -> bool:
        """Whether merges make `piece`: a character is a symbol before any merge; a longer piece is
        made from two that merges make (a piece too long to follow is taken as made)."""
        if len(piece) == 1:
            return True
        if piece not in known:
            known[piece] = piece in vocab and " " not in piece and (len(piece) > 256 or any(
                made(piece[:cut]) and made(piece[cut:]) for cut in range(1, len(piece))))
        return known[piece]

    seen: dict[float, str] = {}
    for token, score in suspects:
        if made(token) and (seen.setdefault(score, token) != token or not missing.isdisjoint(token)):
            types = meta("tokenizer.ggml.token_type") or []
            return SentencePieceMerger(tokens, scores, {i for i, k in enumerate(types) if k == UNKNOWN})
    return None


class SentencePieceMerger:
    """SentencePiece's BPE as llama.cpp runs it (llm_tokenizer_spm, as sentencepiece's own
    bpe_model): the adjacent pair whose join is a token of the highest score merges first, and of
    pairs whose joins score the same, the leftmost; symbols start as characters, tokens or not. A
    `tokenizers` BPE ranks every merge apart, so ties went by token id (with "da" and "ab" scored
    alike, "dab" was ["d", "ab"], llama.cpp's ["da", "b"]), and spells a character with no token in
    bytes before any merge ("▁a" was never made where "▁" is no token). Run in Python over what the
    `tokenizers` BPE split (a segment between added tokens, normalized), only for vocabularies where
    that matters (`sentencepiece_merger`)."""

    def __init__(self, tokens: list[str], scores: list[float], unknown: set):
        self.ids = {t: i for i, t in enumerate(tokens)}  # (a repeated piece: its last id, as llama.cpp's map)
        self.scores = scores
        self.unknown = unknown  # the unknown tokens' ids: a segment holding one has lost its text
        self.bytes = [self.ids.get(f"<0x{b:02X}>") for b in range(256)]

    def merge(self, text: str) -> list[int] | None:
        """The ids of `text` (a normalized segment, spaces as "▁"); characters no merge reached and
        that are no token as their bytes' <0xNN> tokens. None where such a byte has no token."""
        import heapq

        ids, scores, n = self.ids, self.scores, len(text)
        size = [1] * n                      # a symbol's characters, 0 once merged into its left
        before = list(range(-1, n - 1))
        after = [*range(1, n), -1]
        queue = []

        def pair(left: int, right: int) -> None:
            piece = text[left:right + size[right]]
            token = ids.get(piece)
            if token is not None:
                heapq.heappush(queue, (-scores[token], left, right, len(piece)))

        for i in range(n - 1):
            pair(i, i + 1)
        while queue:
            _, left, right, joined = heapq.heappop(queue)
            if not size[left] or not size[right] or size[left] + size[right] != joined:
                continue  # one side merged since
            size[left], size[right] = joined, 0
            after[left] = after[right]
            if after[right] >= 0:
                before[after[right]] = left
            if before[left] >= 0:
                pair(before[left], left)
            if after[left] >= 0:
                pair(left, after[left])
        out, i = [], 0 if n else -1
        while i >= 0:
            piece = text[i:i + size[i]]
            token = ids.get(piece)
            if token is None:
                token = [self.bytes[b] for b in piece.encode()]
                if None in token:
                    return None
                out += token
            else:
                out.append(token)
            i = after[i]
        return out

    def remerge(self, encoding, added: set) -> list[int]:
        """`encoding`'s ids (a `tokenizers` encode) with each segment's merged again here: the
        tokens of one word between added tokens (and the BOS / EOS the template adds, wordless)."""
        ids, pieces, words = encoding.ids, encoding.tokens, encoding.word_ids
        out, at = [], 0
        while at < len(ids):
            end = at + 1
            while end < len(ids) and words[at] is not None and words[end] == words[at]:
                end += 1
            span = ids[at:end]
            text = None
            if words[at] is not None and not (len(span) == 1 and span[0] in added) and not self.unknown & set(span):
                text = _segment_text(pieces[at:end])
            merged = self.merge(text) if text is not None else None
            out += span if merged is None else merged
            at = end
        return out


def _segment_text(pieces: list[str]) -> str | None:
    """The text a segment's pieces spell, <0xNN> runs read back as UTF-8 (None where one is not)."""
    out, run = [], bytearray()
    for piece in [*pieces, ""]:
        byte = BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            run.append(int(byte.group(1), 16))
            continue
        if run:
            try:
                out.append(run.decode("utf-8"))
            except UnicodeDecodeError:
                return None
            run.clear()
        out.append(piece)
    return "".join(out)
