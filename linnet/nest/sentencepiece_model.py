"""A SentencePiece `tokenizer.model` read without the sentencepiece package, as the GGUF keys
llama.cpp's converter writes from it (`gguf_keys`), so that `gguf_tokenizer` builds the tokenizer.

Llama 2's, Mistral's and their kin's Hugging Face repositories may ship only this file (no
tokenizer.json); transformers and vLLM convert it. The file is a protobuf `ModelProto`: its
pieces (text, score, type), a `TrainerSpec` (the model's kind, the special ids) and a
`NormalizerSpec` (the dummy prefix). Only what a BPE model's tokenizer needs is read; the
protobuf wire format is small enough to read here (varints, fixed32, length-delimited).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TokenizerError

# ModelProto's fields: pieces (1), trainer_spec (2), normalizer_spec (3); a piece's: its text (1),
# score (2), type (3, default NORMAL); TrainerSpec's: model_type (3) and the special ids (40-43);
# NormalizerSpec's: add_dummy_prefix (3)
_PIECES, _TRAINER, _NORMALIZER = 1, 2, 3
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
# SentencePiece's piece types are GGUF's token types, number for number
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4


@dataclass
class SentencePieceModel:
    pieces: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    types: list[int] = field(default_factory=list)
    model_type: str = "unigram"      # SentencePiece's default where the file says none
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = -1
    add_dummy_prefix: bool = True


def _fields(data: bytes, where: str):
    """(field number, value) for each field of one message: an int for varints, bytes for
    length-delimited fields, 4 or 8 raw bytes for fixed ones."""
    at, end = 0, len(data)

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            if at >= end or shift > 63:
                raise TokenizerError(f"{where}: not a SentencePiece model (a number runs past its message)")
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
            continue
        size = {1: 8, 5: 4}.get(wire)
        if wire == 2:
            size = varint()
        if size is None or at + size > end:
            raise TokenizerError(f"{where}: not a SentencePiece model (field {number} of wire type {wire} "
                                 "is cut short or of no known kind)")
        yield number, data[at:at + size]
        at += size


def _int32(value: int) -> int:
    """A varint as protobuf's int32: negative numbers are written as 64-bit two's complement."""
    return value - (1 << 64) if value >= 1 << 63 else value


def read_model(path: str | Path) -> SentencePieceModel:
    """The pieces and settings of a SentencePiece model file; a `TokenizerError` naming the file if
    it is not one."""
    path = Path(path)
    where = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"{where}: cannot read ({e.strerror or e})") from None
    model = SentencePieceModel()
    for number, value in _fields(data, where):
        if number == _PIECES and isinstance(value, bytes):
            piece, score, kind = None, 0.0, NORMAL
            for n, v in _fields(value, where):
                if n == 1 and isinstance(v, bytes):
                    try:
                        piece = v.decode("utf-8")
                    except UnicodeDecodeError:
                        raise TokenizerError(f"{where}: piece {len(model.pieces)} is not UTF-8 text") from None
                elif n == 2 and isinstance(v, bytes) and len(v) == 4:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and isinstance(v, int):
                    kind = v
            if piece is None:
                raise TokenizerError(f"{where}: piece {len(model.pieces)} has no text; not a SentencePiece model")
            model.pieces.append(piece)
            model.scores.append(score)
            model.types.append(kind)
        elif number == _TRAINER and isinstance(value, bytes):
            for n, v in _fields(value, where):
                if not isinstance(v, int):
                    continue
                if n == 3:
                    model.model_type = _MODEL_TYPES.get(v, f"type {v}")
                elif n in (40, 41, 42, 43):
                    setattr(model, {40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}[n], _int32(v))
        elif number == _NORMALIZER and isinstance(value, bytes):
            for n, v in _fields(value, where):
                if n == 3 and isinstance(v, int):
                    model.add_dummy_prefix = bool(v)
    if not model.pieces:
        raise TokenizerError(f"{where}: holds no pieces; not a SentencePiece model")
    return model


def gguf_keys(model: SentencePieceModel, where: str, add_bos: bool = True, add_eos: bool = False,
              added: dict[int, tuple[str, bool]] | None = None) -> dict:
    """The `tokenizer.ggml.*` keys llama.cpp's converter writes for this model: its pieces, scores and
    types, with the tokens tokenizer_config.json adds (`added`: id -> (text, special)) after them or
    in their own places, special ones as control tokens; BOS and EOS added as tokenizer_config.json
    says (by default BOS alone, as transformers' Llama tokenizer does). Only BPE models are the
    SentencePiece kind Linnet reads (Llama 2's, Mistral's, Gemma's); a unigram one (T5's kind) is
    refused, not misread."""
    if model.model_type != "bpe":
        raise TokenizerError(f"{where}: a SentencePiece {model.model_type} model; Linnet reads SentencePiece BPE "
                             "models (Llama 2, Mistral) and tokenizer.json files")
    pieces, scores, types = list(model.pieces), list(model.scores), list(model.types)
    for token_id, (text, special) in sorted((added or {}).items()):
        kind = CONTROL if special else USER_DEFINED
        if token_id < len(pieces):
            if pieces[token_id] != text:
                raise TokenizerError(f"{where}: tokenizer_config.json adds {text!r} as token {token_id}, which the "
                                     f"model holds as {pieces[token_id]!r}")
            if types[token_id] in (NORMAL, USER_DEFINED):
                types[token_id] = kind
        elif token_id == len(pieces):
            pieces.append(text)
            scores.append(0.0)
            types.append(kind)
        else:
            raise TokenizerError(f"{where}: tokenizer_config.json adds {text!r} as token {token_id}, but the model "
                                 f"and the tokens added before it end at {len(pieces) - 1}")
    count = len(pieces)

    def token_id(value: int) -> int | None:
        return value if 0 <= value < count else None

    keys = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.add_space_prefix": model.add_dummy_prefix,
            "tokenizer.ggml.add_bos_token": add_bos, "tokenizer.ggml.add_eos_token": add_eos,
            "tokenizer.ggml.unknown_token_id": token_id(model.unk_id),
            "tokenizer.ggml.bos_token_id": token_id(model.bos_id),
            "tokenizer.ggml.eos_token_id": token_id(model.eos_id),
            "tokenizer.ggml.padding_token_id": token_id(model.pad_id)}
    return {k: v for k, v in keys.items() if v is not None}
