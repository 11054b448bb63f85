"""Text <-> token ids, streaming decode, and chat templates.

One `Tokenizer` over a `tokenizers` backend, built either from a Hugging Face
directory (tokenizer.json and friends) or from a GGUF's metadata. Nothing of
transformers is used: it matches transformers' behaviour, and the tests hold
it to that.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator


from .chat_template import render_chat_template
from .errors import TokenizerError
from .gguf_tokenizer import ASCII_SPACE, BYTE_TOKEN


def _gpt2_bytes() -> dict:
    """GPT-2's byte-level table, reversed: {the character a byte is written as: the byte}. Printable
    bytes stand for themselves; the rest are written as the characters from U+0100 on, in order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = [b for b in range(256) if b not in kept]
    table = {chr(b): b for b in kept}
    table.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return table


_UNICODE_TO_BYTE = _gpt2_bytes()


def _byte_kind(backend) -> str:
    """"byte_level" where the decoder maps GPT-2's characters back to bytes, "sentencepiece" where
    it reads <0xNN> byte tokens (byte fallback) or turns SentencePiece's "▁" into spaces (Metaspace,
    whose decoding of one token drops its leading space), "" otherwise (a token's bytes are its text's)."""
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [d.get("type") for d in decoder.get("decoders", [decoder])] if isinstance(decoder, dict) else []
    if "ByteLevel" in kinds:
        return "byte_level"
    return "sentencepiece" if "ByteFallback" in kinds or "Metaspace" in kinds else ""


_REPLACEMENT = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence
_CONTEXT_IDS = 4  # prompt ids decoded before a completion's, for the decoder's view of where it starts
# whitespace outside ASCII (U+00A0, U+3000, ...): what `tokenizers` strips after a token and llama.cpp does not
_WIDE_SPACE = re.compile(r"[^\S\x00-\x7f]")
RELEASE_GIL_FROM = 1 << 14  # characters from which `encode` lets other threads run (a batch's overhead below)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # (RecursionError: arrays nested thousands deep)
        raise TokenizerError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):  # (was an AttributeError from the first .get)
        raise TokenizerError(f"{path}: holds a JSON {'null' if data is None else type(data).__name__}, not an object "
                             "of settings")
    return data


def _read_template(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path}: a chat template that is not UTF-8 text ({e})") from None


def _token_text(value) -> str | None:
    # tokenizer_config writes special tokens as "text" or {"content": "text", ...}
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


# generation_config.json's keys that a server's request takes where it does not set the field, as
# vLLM's (its --generation-config auto): HF's max_new_tokens is a request's max_tokens
SAMPLING_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                     "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def sampling_problem(key: str, value) -> str | None:
    """Why generation config `key`'s `value` is no default a request can take ("a number", "between
    0 and 1"), or None where it is one."""
    # what a request takes in each of those fields: the engine's ranges, and max_tokens any count (imported
    # here: linnet.serve brings the engine, which a model loaded without its tokenizer need not hold)
    from linnet.serve.request import SAMPLING_RANGES

    least, most, whole = {**SAMPLING_RANGES, "max_new_tokens": (1, None, True)}[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value or value in (
            float("inf"), float("-inf")):
        return "a number"
    if whole and value != int(value):
        return "a whole number"
    if value < least or (most is not None and value > most):
        return f"{least} or more" if most is None else f"between {least:g} and {most:g}"
    return None


def _sampling_defaults(gen: dict, where: Path | None = None) -> dict:
    """The request fields a generation config sets. A null is none; any other value a request cannot
    take (text, a negative temperature, a top_k of 0.5) is none too, with a warning naming `where` (the
    file): every request that left the field out was refused for a value it had not sent."""
    import warnings

    out = {}
    for key, field in SAMPLING_DEFAULTS.items():
        value = gen.get(key)
        if value is None:
            continue
        problem = sampling_problem(key, value)
        if problem is None:
            out[field] = value
        elif where is not None:
            warnings.warn(f"{where}: {key} is {json.dumps(value)}, not {problem}; requests that leave {field} out "
                          f"take the API's default", stacklevel=3)
    return out


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_id_list(value, path: Path, key: str) -> list[int]:
    """`key`'s token id or ids in the config at `path` (none where it is null)."""
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if not all(map(_is_id, ids)):
        raise TokenizerError(f"{path}: {key} is {value!r}; a token id is a whole number, or a list of them")
    return ids


def _config_eos_ids(d: Path, gen: dict, model_cfg: dict) -> list[int]:
    """The end tokens of the model in directory `d`: its generation config's eos_token_id (one or a list),
    else its config.json's."""
    return (_as_id_list(gen.get("eos_token_id"), d / "generation_config.json", "eos_token_id")
            or _as_id_list(model_cfg.get("eos_token_id"), d / "config.json", "eos_token_id"))


def end_token_ids(ckpt) -> list[int]:
    """The tokens a checkpoint's model ends generation on, read without its tokenizer (loaded with
    tokenizer=False): those its tokenizer's `eos_token_ids` would be, as vLLM's skip_tokenizer_init
    still stops on the generation config's. A GGUF's are llama.cpp's end-of-generation tokens."""
    from .checkpoint import GGUFCheckpoint

    if isinstance(ckpt, GGUFCheckpoint):
        from .gguf_tokenizer import END_KEYS, end_of_generation

        meta = ckpt.metadata
        return end_of_generation(meta("tokenizer.ggml.tokens") or [],
                                 [meta(f"tokenizer.ggml.{key}_token_id") for key in END_KEYS])
    d = Path(ckpt.path)
    d = d if d.is_dir() else d.parent
    return _config_eos_ids(d, _read_json(d / "generation_config.json"), _read_json(d / "config.json"))


def _as_id(value, path: Path, key: str) -> int | None:
    ids = _as_id_list(value, path, key)  # (a list of one id is that id: it names one token all the same)
    if len(ids) > 1:
        raise TokenizerError(f"{path}: {key} is {value!r}; one token id, not a list")
    return ids[0] if ids else None


def _unique(ids: Iterable[int]) -> list[int]:
    out: list[int] = []
    for i in ids:
        if i is not None and i not in out:
            out.append(i)
    return out


def _lone_surrogate(text: str) -> str | None:
    """Why tokenizers will not take `text`, a str: it holds a lone surrogate (JSON's "\\ud800" writes
    one, and Python reads a command line's bytes that are not UTF-8 as such), which has no UTF-8."""
    at = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
    if at is None:
        return None
    code = ord(text[at])
    byte = f" (Python's stand-in for the byte 0x{code - 0xDC00:02X}, read where UTF-8 was expected)" \
        if 0xDC80 <= code <= 0xDCFF else ""
    return (f"the text holds a lone surrogate, U+{code:04X}{byte}, at character {at}: it is not Unicode text, "
            f"and has no UTF-8 bytes to tokenize")


SENTENCEPIECE_FILE = "tokenizer.model"


def _sentencepiece_backend(path: Path, tc: dict, stm: dict):
    """(a `tokenizers` tokenizer, {"bos_token": text, ...}, its `SentencePieceMerger` or None) for a
    SentencePiece tokenizer.model, built as for a GGUF holding the same vocabulary
    (`sentencepiece_model.gguf_keys`: what llama.cpp's converter writes from the file), with the
    tokens, the BOS / EOS flags and the special tokens tokenizer_config.json (or
    special_tokens_map.json) names in the model's place."""
    from .gguf_tokenizer import build_gguf_tokenizer, sentencepiece_merger
    from .sentencepiece_model import gguf_keys, read_model

    added = {}
    for key, entry in (tc.get("added_tokens_decoder") or {}).items():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and str(key).isdigit():
            added[int(key)] = (entry["content"], bool(entry.get("special", False)))
    keys = gguf_keys(read_model(path), str(path), add_bos=bool(tc.get("add_bos_token", True)),
                     add_eos=bool(tc.get("add_eos_token", False)), added=added)
    ids = {token: i for i, token in enumerate(keys["tokenizer.ggml.tokens"])}
    for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        named = _token_text(tc.get(f"{name}_token")) or _token_text(stm.get(f"{name}_token"))
        if named in ids:  # the one transformers adds (add_bos_token, add_eos_token) and names
            keys[f"tokenizer.ggml.{key}_token_id"] = ids[named]
    meta = lambda key, default=None: keys.get(key, default)  # noqa: E731
    try:
        backend, _ = build_gguf_tokenizer(meta)
    except TokenizerError as e:
        raise TokenizerError(f"{path}: {e}") from None
    tokens = keys["tokenizer.ggml.tokens"]
    specials = {f"{name}_token": tokens[keys[f"tokenizer.ggml.{key}_token_id"]]
                for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))
                if f"tokenizer.ggml.{key}_token_id" in keys}
    _strip_as_configured(backend, tc)
    return backend, specials, sentencepiece_merger(meta)


def _strip_as_configured(backend, tc: dict) -> None:
    """The added tokens of tokenizer_config.json's added_tokens_decoder that take the whitespace beside
    them (lstrip, rstrip: Phi-3's chat tokens, its rstrip), made to take it as transformers makes them."""
    from tokenizers import AddedToken

    strips = {entry["content"]: (bool(entry.get("lstrip")), bool(entry.get("rstrip")))
              for entry in (tc.get("added_tokens_decoder") or {}).values()
              if isinstance(entry, dict) and isinstance(entry.get("content"), str)}
    for token in backend.get_added_tokens_decoder().values():
        if any(strips.get(token.content, ())):
            lstrip, rstrip = strips[token.content]
            redone = AddedToken(token.content, special=token.special, normalized=token.normalized, lstrip=lstrip,
                                rstrip=rstrip, single_word=token.single_word)
            (backend.add_special_tokens if token.special else backend.add_tokens)([redone])


class Tokenizer:
    """encode/decode plus what generation needs: stop tokens and the chat template."""

    def __init__(
        self,
        backend,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        eos_token_ids: Iterable[int] = (),
        bos_token_id: int | None = None,
        chat_template: str | None = None,
        special_tokens: dict[str, str | None] | None = None,
        source: str = "",
        chat_templates: dict[str, str] | None = None,
        sampling_defaults: dict | None = None,
        merger=None,
        splitter=None,
        rstripped: frozenset = frozenset(),
    ):
        self.backend = backend          # a tokenizers.Tokenizer
        self.source = source            # where it came from, for messages
        self.bos_token = bos_token
        self.eos_token = eos_token
        if bos_token_id is None and bos_token is not None:
            bos_token_id = backend.token_to_id(bos_token)
        self.bos_token_id: int | None = bos_token_id
        eos = list(eos_token_ids)
        if eos_token is not None:
            eos.append(backend.token_to_id(eos_token))
        self.eos_token_ids: list[int] = _unique(eos)
        # the model's own end token (transformers' eos_token_id): the others among eos_token_ids (a generation
        # config's <|eom_id|> beside Llama 3's <|eot_id|>) are vLLM's stop token ids, which a reply names
        self.eos_token_id: int | None = backend.token_to_id(eos_token) if eos_token is not None else \
            next(iter(self.eos_token_ids), None)
        self.chat_template = chat_template
        # the weights' other templates by name ("tool_use", "rag", ...): a model may write its tools'
        # prompt in a template of its own, which transformers, vLLM and llama.cpp take when tools are given
        self.chat_templates: dict[str, str] = dict(chat_templates or {})
        # the model's generation config's sampling settings, by request field (`_sampling_defaults`):
        # what a server's request takes where it sets none
        self.sampling_defaults: dict = dict(sampling_defaults or {})
        # variables a chat template sees besides messages (bos_token, eos_token, ...)
        self.special_tokens = {"bos_token": bos_token, "eos_token": eos_token, **(special_tokens or {})}
        self._byte_kind: str | None = None  # how pieces hold bytes (`token_bytes`), read on first use
        self._bytes: dict = {}
        self._added: set | None = None
        self._special: set | None = None
        # a SentencePiece vocabulary whose pieces tie on score (or hold a character that is no token)
        # merges them again as llama.cpp does (`gguf_tokenizer.SentencePieceMerger`), which the
        # backend's ranked merges cannot
        self.merger = merger
        # a GGUF vocabulary whose added tokens can overlap in a text takes them where llama.cpp does,
        # longest first (`gguf_tokenizer.SpecialSplitter`), not leftmost as the backend does
        self.splitter = splitter
        # the added tokens a GGUF's llama.cpp strips the ASCII whitespace after (Phi-3's chat tokens:
        # `gguf_tokenizer.rstripped`); the backend's strip Unicode's, which `encode` mends
        self.rstripped = rstripped
        self._frame: dict = {}

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        """Another template replaces the weights' named ones too, as vLLM's --chat-template does."""
        self._chat_template = template
        self.chat_templates = {}

    def saved_chat_template(self) -> str | list | None:
        """The templates as tokenizer_config.json and GGUF's writer take them: the template, or with
        named ones a list of {"name", "template"}, the template as "default"."""
        if not self.chat_templates or self.chat_template is None:
            return self.chat_template
        named = {"default": self.chat_template, **self.chat_templates}
        return [{"name": name, "template": template} for name, template in named.items()]

    # ---------------------------------------------------------------- build

    @classmethod
    def from_dir(cls, hf_dir: str | os.PathLike) -> "Tokenizer":
        """From a Hugging Face model directory: tokenizer.json, or where there is none a SentencePiece
        tokenizer.model (as Llama 2's and Mistral's repositories may ship it alone), then
        tokenizer_config.json, generation_config.json (and chat_template.jinja,
        special_tokens_map.json, config.json where present)."""
        from tokenizers import Tokenizer as Backend

        d = Path(hf_dir)
        path = d / "tokenizer.json"
        tc = _read_json(d / "tokenizer_config.json")
        stm = _read_json(d / "special_tokens_map.json")
        model_specials: dict = {}  # a tokenizer.model's own BOS, EOS and unknown tokens
        merger = None
        if path.is_file():
            try:
                backend = Backend.from_file(str(path))
            except Exception as e:
                from .checkpoint import lfs_pointer

                raise TokenizerError(lfs_pointer(path) or f"{path}: cannot load ({e})") from None
        elif (d / SENTENCEPIECE_FILE).is_file():
            backend, model_specials, merger = _sentencepiece_backend(d / SENTENCEPIECE_FILE, tc, stm)
        else:
            raise TokenizerError(f"{d}: no tokenizer.json, nor a SentencePiece {SENTENCEPIECE_FILE} to build one "
                                 "from (a model's tokenizer is one of these files)")
        gen = _read_json(d / "generation_config.json")
        model_cfg = _read_json(d / "config.json")

        def special(name):
            return _token_text(tc.get(name)) or _token_text(stm.get(name)) or model_specials.get(name)

        # named templates: a list in tokenizer_config, or (as transformers 5 saves them) files of their
        # own beside chat_template.jinja, in additional_chat_templates
        named = tc.get("chat_template")
        if not isinstance(named, list):
            named = [{"name": "default", "template": named}]
        named = {t.get("name"): t.get("template") for t in named if isinstance(t, dict)}
        jinja = d / "chat_template.jinja"
        if jinja.is_file():
            named["default"] = _read_template(jinja)
        for file in sorted((d / "additional_chat_templates").glob("*.jinja")):
            named[file.stem] = _read_template(file)
        named = {name: t for name, t in named.items() if isinstance(name, str) and isinstance(t, str)}
        template = named.pop("default", None) or next(iter(named.values()), None)
        gen_path, cfg_path = d / "generation_config.json", d / "config.json"
        eos_ids = _config_eos_ids(d, gen, model_cfg)
        bos_id = None
        if special("bos_token") is None:
            bos_id = (_as_id(gen["bos_token_id"], gen_path, "bos_token_id") if "bos_token_id" in gen
                      else _as_id(model_cfg.get("bos_token_id"), cfg_path, "bos_token_id"))
        return cls(
            backend,
            bos_token=special("bos_token"),
            eos_token=special("eos_token"),
            eos_token_ids=eos_ids,
            bos_token_id=bos_id,
            chat_template=template,
            special_tokens={"unk_token": special("unk_token"), "pad_token": special("pad_token")},
            source=str(d),
            chat_templates=named,
            sampling_defaults=_sampling_defaults(gen, gen_path),
            merger=merger,
        )

    @classmethod
    def from_gguf(cls, gguf) -> "Tokenizer":
        """From a GGUF file path or an open `GGUFCheckpoint` (to read the file once)."""
        from .checkpoint import GGUFCheckpoint
        from .gguf_tokenizer import build_gguf_tokenizer, rstripped, sentencepiece_merger, special_splitter

        ckpt = gguf if isinstance(gguf, GGUFCheckpoint) else GGUFCheckpoint(gguf)
        meta = ckpt.metadata
        try:
            backend, types = build_gguf_tokenizer(meta)
        except TokenizerError as e:
            raise TokenizerError(f"{ckpt.path}: {e}") from None
        tokens = meta("tokenizer.ggml.tokens")

        def text(key):
            tid = meta(f"tokenizer.ggml.{key}_token_id")
            return tokens[tid] if tid is not None and 0 <= tid < len(tokens) else None

        # llama.cpp ends generation on EOS, on EOT / EOM (and its FIM padding and separators) where the
        # file names them, and on the tokens it knows by their text
        stops = end_token_ids(ckpt)
        tok = cls(
            backend,
            bos_token=text("bos"),
            eos_token=text("eos"),
            eos_token_ids=stops,
            bos_token_id=meta("tokenizer.ggml.bos_token_id"),
            chat_template=meta("tokenizer.chat_template"),
            special_tokens={"unk_token": text("unknown"), "pad_token": text("padding")},
            source=ckpt.path,
            # llama.cpp's converter writes a template's other ones by name, listed in tokenizer.chat_templates
            chat_templates={name: meta(f"tokenizer.chat_template.{name}")
                            for name in meta("tokenizer.chat_templates") or []
                            if isinstance(meta(f"tokenizer.chat_template.{name}"), str)},
            merger=sentencepiece_merger(meta),
            splitter=special_splitter(tokens, types),
            rstripped=rstripped(meta, tokens, types),
        )
        tok.eos_token_ids = stops  # the EOS only where llama.cpp ends on it (Gemma 4's </s> is a plain token)
        return tok

    # ---------------------------------------------------------------- use

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def id_end(self) -> int:
        """One past the largest id the tokenizer gives: its count, or more where its ids leave gaps (what a
        model's vocabulary must reach for every token to have its row)."""
        return max(self.backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def special_token_id(self, name: str) -> int | None:
        """The id of the special token `name` ("pad_token", "unk_token"), None where there is none."""
        text = self.special_tokens.get(name)
        return self.token_to_id(text) if text is not None else None

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, whole where its text alone is not (OpenAI's logprob
        `bytes`): a byte-level BPE token's characters map back to bytes (GPT-2's table), a
        SentencePiece byte token <0xNN> is its byte, its "▁" a space; one that ends inside a
        character decodes to U+FFFD, which these do not."""
        if token_id not in self._bytes:
            kind = self._bytes_kind()
            piece = self.backend.id_to_token(token_id)
            added = token_id in self._added_ids()
            if piece is None or added or not kind:
                out = self.decode([token_id]).encode()
            elif kind == "byte_level":
                out = bytes(_UNICODE_TO_BYTE[c] for c in piece) if all(c in _UNICODE_TO_BYTE for c in piece) \
                    else self.decode([token_id]).encode()
            elif (byte := BYTE_TOKEN.fullmatch(piece)) is not None:
                out = bytes([int(byte.group(1), 16)])
            else:
                out = piece.replace("\u2581", " ").encode()
            self._bytes[token_id] = out
        return self._bytes[token_id]

    def without_cut_character(self, text: str, ids: list) -> str:
        """`text` (the decoding of `ids`, or of ids that end as they do) less the U+FFFD it ends
        in where the ids stop partway through a character: how a reply cut there ends, as vLLM's
        detokenizer ends it. A character is at most 4 bytes, so the last 4 ids tell."""
        if not text.endswith(_REPLACEMENT):
            return text
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(b"".join(self.token_bytes(int(t)) for t in ids[-4:]))
        return text[:-1] if decoder.getstate()[0] else text

    def _bytes_kind(self) -> str:
        if self._byte_kind is None:
            self._byte_kind = _byte_kind(self.backend)
        return self._byte_kind

    def _added_ids(self) -> set:
        if self._added is None:
            self._added = set(self.backend.get_added_tokens_decoder())
        return self._added

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special tokens written in `text` (e.g. <|im_start|>) always map to their ids;
        add_special_tokens adds the BOS/EOS the tokenizer's post-processor asks for.

        A long text is encoded as a batch of one, which lets go of the GIL: `encode` holds it, and
        a 4 MB prompt held a server's engine thread and its event loop for 2.4 s."""
        try:
            if len(text) < RELEASE_GIL_FROM:
                encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
            else:
                encoding = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]
        except TypeError:
            why = _lone_surrogate(text) if isinstance(text, str) else None
            if why is None:
                raise
            raise TokenizerError(why) from None
        if self.splitter is not None or (self.rstripped and _WIDE_SPACE.search(text)):
            ids = self._split_as_llama_cpp(text, encoding, add_special_tokens)
            if ids is not None:
                return ids
        return encoding.ids if self.merger is None else self.merger.remerge(encoding, self._added_ids())

    def _split_as_llama_cpp(self, text: str, encoding, add_special_tokens: bool) -> list[int] | None:
        """`text`'s ids with its added tokens taken where llama.cpp takes them (`splitter`), the text
        between them encoded apart, less the ASCII whitespace after a token of `rstripped`; None where
        they are those the backend took (`encoding`'s), and it stripped what llama.cpp strips."""
        added, backend = self._added_ids(), self.backend
        if added.isdisjoint(encoding.ids):
            return None
        # (a token of `rstripped`: its offsets hold the whitespace the backend stripped after it)
        hits = [(start, end, backend.id_to_token(i)) for i, (start, end) in zip(encoding.ids, encoding.offsets)
                if i in added and end > start]
        matched = [(start, start + len(token), token) for start, _, token in hits if text.startswith(token, start)]
        spans = self.splitter.split(text, matched) if self.splitter is not None else None
        if spans is None:
            # the backend strips Unicode's whitespace, llama.cpp ASCII's alone
            if not any(text[start + len(token):end].strip(ASCII_SPACE) for start, end, token in hits
                       if token in self.rstripped and text.startswith(token, start)):
                return None
            spans = matched
        texts, at, before = [], 0, None
        for start, end, token in [*spans, (len(text), len(text), None)]:
            between = text[at:start].lstrip(ASCII_SPACE) if before in self.rstripped else text[at:start]
            texts += [between] if between else []
            texts += [token] if token is not None else []
            at, before = end, token
        tokens = {token for _, _, token in spans}
        body = []
        for piece, part in zip(texts, backend.encode_batch(texts, add_special_tokens=False)):
            if piece in tokens or self.merger is None:
                body += part.ids
            else:
                body += self.merger.remerge(part, added)
        front, back = self._frame_ids(add_special_tokens)
        return front + body + back

    def _frame_ids(self, add_special_tokens: bool) -> tuple[list, list]:
        """The ids the post-processor puts before a text's and after them (BOS, EOS)."""
        if add_special_tokens not in self._frame:
            frame: tuple[list, list] = ([], [])
            processor = self.backend.post_processor
            if add_special_tokens and processor is not None:
                state = json.loads(processor.__getstate__())
                side, ids = 0, state.get("special_tokens", {})
                for item in state.get("single", []):
                    if "Sequence" in item:
                        side = 1
                    else:
                        frame[side].extend(ids[item["SpecialToken"]["id"]]["ids"])
            self._frame[add_special_tokens] = frame
        return self._frame[add_special_tokens]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`. A run of SentencePiece byte tokens (<0xNN>) that is not UTF-8 throughout
        reads as Python's decode("utf-8", "replace") (and a server reading llama.cpp's bytes) reads it,
        one U+FFFD for each bad sequence: `tokenizers`' ByteFallback decoder writes one for every byte
        of the run, a whole character before or after a stray byte too, so a text streamed token by
        token did not add up to its whole decode."""
        ids = list(ids)
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if _REPLACEMENT in text and self._bytes_kind() == "sentencepiece":
            mended = self._mend_byte_runs(ids, skip_special_tokens)
            if mended is not None:
                text = self.backend.decode(mended, skip_special_tokens=skip_special_tokens)
        return text

    def _mend_byte_runs(self, ids: list, skip_special_tokens: bool) -> list | None:
        """`ids` with each run of byte tokens (as the decoder sees them: skipped special tokens left
        out) respelled as the byte tokens of its text read with U+FFFD for each bad sequence, which
        the decoder reads as that text; None where a byte of that text has no token."""
        special = self._special_ids() if skip_special_tokens else set()
        mended, run = [], bytearray()
        for token_id in [*ids, None]:
            if token_id in special:
                continue
            piece = None if token_id is None else self.backend.id_to_token(int(token_id))
            byte = BYTE_TOKEN.fullmatch(piece) if piece is not None else None
            if byte is not None:
                run.append(int(byte.group(1), 16))
                continue
            if run:
                spelled = [self.backend.token_to_id(f"<0x{b:02X}>") for b in bytes(run).decode("utf-8", "replace").encode()]
                if None in spelled:
                    return None
                mended += spelled
                run.clear()
            if piece is not None:
                mended.append(token_id)
        return mended

    def _special_ids(self) -> set:
        if self._special is None:
            self._special = {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        return self._special

    def decode_after(self, context: Iterable[int], ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text `ids` add after `context` (a prompt): decoders that treat a text's first token
        specially (SentencePiece's strip its leading space) see the first id mid-text, where it is."""
        context = self._context(context, skip_special_tokens)
        ids = list(ids)
        if not context:
            return self.decode(ids, skip_special_tokens)
        before = self.decode(context, skip_special_tokens)
        whole = self.decode(context + ids, skip_special_tokens)
        return whole[len(before):] if whole.startswith(before) else self.decode(ids, skip_special_tokens)

    def _context(self, context: Iterable[int], skip_special_tokens: bool) -> list[int]:
        """The last few ids of `context`, but those of a character it ends inside (their text is the
        reply's to complete or not): the rest still shows a decoder the reply's first token mid-text
        (all of them left out, SentencePiece's strip took the reply's leading space)."""
        tail = [int(t) for t in list(context)[-_CONTEXT_IDS:]]
        for _ in range(4):  # (a character is at most 4 bytes of UTF-8: 4 byte tokens, at most)
            if not tail or not self.decode(tail, skip_special_tokens).endswith(_REPLACEMENT):
                return tail
            tail = tail[:-1]
        return []

    def incremental_decoder(self, skip_special_tokens: bool = False, context: Iterable[int] = ()) -> "IncrementalDecoder":
        """Pieces of text as ids come; with `context` (the prompt) they add up to `decode_after`."""
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens,
                                  context=self._context(context, skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, template: str | None = None,
        **kwargs: Any
    ) -> str:
        """The prompt text for `messages`; extra kwargs (tools=...) go to the template. `template`:
        another template than the tokenizer's (a request's own). Given tools, the weights' template
        named "tool_use" writes the prompt where they have one (as transformers, vLLM and llama.cpp)."""
        if template is None and kwargs.get("tools") is not None:
            template = self.chat_templates.get("tool_use")
        template = template or self.chat_template
        if not template:
            raise TokenizerError(f"{self.source or 'this tokenizer'}: no chat template")
        return render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **kwargs,
        )


class IncrementalDecoder:
    """Turns token ids, one at a time, into text pieces for streaming.

    Byte-level tokens may end inside a multi-byte UTF-8 character; a piece is
    held back until the character is complete. Each step decodes a small
    window starting one emitted token back (so decoders that treat the first
    token specially, e.g. strip a leading space, see the same context as in a
    full decode), and emits the text beyond what the window already gave.
    The concatenated pieces plus `flush()` equal `decode(all_ids)`, or with a
    context (the prompt's last ids) `decode_after(context, all_ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False, context: list[int] = ()):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(context)  # the window: ids from the last context token on
        self._read = len(self._ids)           # ids in the window whose text is already emitted

    def _text(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def push(self, token_id: int) -> str:
        """Add one id; return the new text it completes ("" if none yet)."""
        self._ids.append(int(token_id))
        before = self._text(self._ids[: self._read])
        after = self._text(self._ids)
        if len(after) <= len(before) or after.endswith(_REPLACEMENT):
            return ""
        # slide the window: the newest emitted token becomes the context
        self._ids = self._ids[self._read :]
        self._read = len(self._ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is held back (an incomplete character decodes as U+FFFD)."""
        before = self._text(self._ids[: self._read])
        after = self._text(self._ids)
        self._ids = self._ids[-1:] if self._ids else []
        self._read = len(self._ids)
        return after[len(before) :]

    def finish(self) -> str:
        """What `flush()` gives, less a character the last ids stop inside (its U+FFFD): the end
        of a reply cut mid-character (by max_tokens), as vLLM's detokenizer ends it."""
        ids = self._ids
        return self._tok.without_cut_character(self.flush(), ids)

    def stream(self, ids: Iterable[int]) -> Iterator[str]:
        """Yield text pieces as ids arrive, then what flush() gives."""
        for token_id in ids:
            piece = self.push(token_id)
            if piece:
                yield piece
        tail = self.flush()
        if tail:
            yield tail
