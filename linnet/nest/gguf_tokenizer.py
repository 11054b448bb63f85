"""Build a `tokenizers` byte-level BPE tokenizer from a GGUF's metadata.

A GGUF carries no tokenizer.json: it has the vocabulary
(`tokenizer.ggml.tokens`), the merges, a type per token, and a *name* for how
text is split before BPE (`tokenizer.ggml.pre`). llama.cpp gives each name a
list of regexes applied in turn, each one splitting the pieces the previous
one produced; `PRE_TOKENIZERS` below restates those we support as
`tokenizers` pre-tokenizers.

"smollm" (SmolLM/SmolLM2), like "starcoder", first isolates every digit
(\\p{N}) and then applies GPT-2's regex to each piece. That differs from plain
GPT-2 splitting only around whitespace runs before a digit: "a  1" splits as
["a", "  ", "1"] here and as ["a", " ", " 1"] under GPT-2's regex alone.
"""

from __future__ import annotations

from functools import lru_cache

from .errors import TokenizerError

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

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
    (("gpt2", "default", "mpt", "olmo", "jais"), ((GPT2_SPLIT,), False)),
    (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
     ((r"\p{N}", GPT2_SPLIT), False)),
    (("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), ((LLAMA3_SPLIT,), True)),
    (("qwen2", "deepseek-r1-qwen"), ((QWEN2_SPLIT,), False)),
    (("gpt-4o", "llama4"), ((GPT4O_SPLIT,), False)),
):
    for _name in _names:
        PRE_TOKENIZERS[_name] = _rule


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


def build_bpe_tokenizer(meta) -> "tokenizers.Tokenizer":  # noqa: F821
    """A `tokenizers.Tokenizer` for a GGUF whose tokenizer.ggml.model is "gpt2".

    `meta(key, default)` reads GGUF metadata (GGUFCheckpoint.metadata).
    Control and unknown tokens become special added tokens (matched whole in
    text, dropped by skip_special_tokens); user-defined ones become plain
    added tokens. A BOS/EOS is added on encode when the GGUF says so
    (tokenizer.ggml.add_bos_token / add_eos_token, default off).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    kind = meta("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(f"GGUF tokenizer model {kind!r} is not supported; only byte-level BPE ('gpt2') is")
    tokens: list[str] = meta("tokenizer.ggml.tokens") or []
    merges: list[str] = meta("tokenizer.ggml.merges") or []
    types: list[int] = meta("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    pre = meta("tokenizer.ggml.pre", "default")
    if not tokens or not merges:
        raise TokenizerError("the GGUF lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")

    alphabet = byte_alphabet()
    spelled = set(alphabet.values())
    vocab: dict[str, int] = {}
    for i, (tok, kind_) in enumerate(zip(tokens, types)):
        # A normal token written in plain text (outside the byte alphabet) is
        # respelled; special tokens keep their text, which is what they match.
        if kind_ == NORMAL and not set(tok) <= spelled:
            tok = "".join(alphabet[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    _, ignore_merges = PRE_TOKENIZERS.get(pre, ((), False))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges, fuse_unk=False))
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()

    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k in (CONTROL, UNKNOWN)]
    plain = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    if special:
        tk.add_special_tokens(special)
    if plain:
        tk.add_tokens(plain)

    pieces_single, pieces_pair, used = ["$A:0"], ["$A:0", "$B:1"], []
    for flag, key, front in (("add_bos_token", "bos", True), ("add_eos_token", "eos", False)):
        tid = meta(f"tokenizer.ggml.{key}_token_id")
        if meta(f"tokenizer.ggml.{flag}", False) and tid is not None:
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
    return tk
