"""Read tensors and a config from a checkpoint, one tensor at a time.

Two formats, one interface (`Checkpoint`):

- a Hugging Face model directory: config.json plus model.safetensors, or
  shards listed in model.safetensors.index.json (`SafetensorsCheckpoint`);
- a llama.cpp GGUF file (`GGUFCheckpoint`), dequantized to float32 on load.

Names are the checkpoint's own (HF names for a directory, GGUF names for a
GGUF); mapping them onto a model is the card's job, not this module's. Shapes
are always in the PyTorch convention (out, in), also for GGUF, whose own
dimension order is the reverse.

Files are memory-mapped: opening a checkpoint reads headers only, and
`load` touches the bytes of the one tensor asked for.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import json
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from linnet.kernels.build import cores as _cores  # the cores a tensor's rows are shared over

from . import mxfp4
from .autocard import with_transformers_defaults
from .errors import WeightsError

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
_SHARD_NAME = re.compile(r"(.+)-(\d{5})-of-(\d{5})\.safetensors")  # transformers' shards: model-00001-of-00004...

# safetensors' dtype names -> ours (short, lower case, as in the IR)
_ST_DTYPES = {
    "F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16",
    "I64": "i64", "I32": "i32", "I16": "i16", "I8": "i8", "U8": "u8",
    "BOOL": "bool", "F8_E4M3": "f8_e4m3", "F8_E5M2": "f8_e5m2",
}


class Checkpoint(ABC):
    """A set of named tensors plus a Hugging Face style config."""

    path: str     # for messages
    format: str   # "safetensors" | "gguf"

    @abstractmethod
    def names(self) -> list[str]:
        """Every tensor name, in the checkpoint's own naming."""

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]:
        """Logical shape in the PyTorch convention, e.g. (vocab, dim) for embeddings."""

    @abstractmethod
    def stored_dtype(self, name: str) -> str:
        """How the tensor is stored: "f32", "bf16", "q4_1", ..."""

    @abstractmethod
    def load(self, name: str, framework: str = "numpy"):
        """One tensor: a numpy array (framework="numpy") or a torch tensor ("torch")."""

    @abstractmethod
    def config(self) -> dict:
        """A config.json-style dict (hidden_size, num_hidden_layers, ...)."""

    @property
    def source_format(self) -> str:
        """Which of a card param's sources names its tensors here: "gguf", or "hf" (a Hugging Face model's)."""
        return "gguf" if self.format == "gguf" else "hf"

    def __contains__(self, name: str) -> bool:
        return name in set(self.names())

    def file_of(self, name: str) -> str:
        """The file holding tensor `name` (the shard, for a sharded checkpoint), for messages."""
        return self.path

    def files(self) -> list[str]:
        """Every file its tensors are read from (the shards, a GGUF's splits), for messages."""
        return [self.path]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    def _unknown(self, name: str) -> WeightsError:
        close = difflib.get_close_matches(name, self.names(), n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        return WeightsError(f"{self.path}: no tensor named {name!r}{hint}")


class UnderPrefix(Checkpoint):
    """A checkpoint saved from a base model, read under the names of the model around it, as transformers
    loads one (its `base_model_prefix`): GPT-2's on the hub holds `wte.weight`, `h.0.attn.c_attn.weight`,
    which GPT2LMHeadModel (and gpt2.linnet) name `transformer.wte.weight`, ... Each stored name is read as
    `prefix` + it; what it does not hold (a head) it holds under no name."""

    def __init__(self, inner: Checkpoint, prefix: str):
        self.inner, self.prefix = inner, prefix
        self.path, self.format = inner.path, inner.format

    def _stored(self, name: str) -> str:
        return name[len(self.prefix):] if name.startswith(self.prefix) else "\0" + name  # (no stored name)

    def names(self) -> list[str]:
        return [self.prefix + n for n in self.inner.names()]

    def __contains__(self, name: str) -> bool:
        return self._stored(name) in self.inner

    def shape(self, name: str) -> tuple[int, ...]:
        return self.inner.shape(self._stored(name))

    def stored_dtype(self, name: str) -> str:
        return self.inner.stored_dtype(self._stored(name))

    def load(self, name: str, framework: str = "numpy", **kwargs):
        return self.inner.load(self._stored(name), framework, **kwargs)

    def file_of(self, name: str) -> str:
        return self.inner.file_of(self._stored(name))

    def config(self) -> dict:
        return self.inner.config()

    def files(self) -> list[str]:
        return self.inner.files()

    def __getattr__(self, attr):  # what else a checkpoint of the inner's kind has (its config_tensors, ...)
        return getattr(self.inner, attr)


def under_base_prefix(ckpt: Checkpoint, wanted: list[str]) -> Checkpoint:
    """`ckpt`, or where it holds none of the `wanted` names under their first part ("transformer.") but
    every one of them less that part, `ckpt` read under it (`UnderPrefix`): a base model's checkpoint."""
    missing = [n for n in wanted if n not in ckpt]
    prefixes = {n.split(".", 1)[0] + "." for n in missing if "." in n}
    if len(prefixes) != 1:
        return ckpt
    prefix = prefixes.pop()
    held = ckpt.names()
    if any(n.startswith(prefix) for n in held):
        return ckpt
    under = UnderPrefix(ckpt, prefix)
    return under if all(n in under for n in missing) else ckpt


def _check_framework(framework: str) -> None:
    if framework not in ("numpy", "torch"):
        raise ValueError(f"framework must be 'numpy' or 'torch', not {framework!r}")


# ---------------------------------------------------------------- safetensors


class SafetensorsCheckpoint(Checkpoint):
    """A Hugging Face model directory of safetensors files.

    All shard headers are read on construction, so a missing or corrupt
    shard is reported at once rather than halfway through a load.
    """

    format = "safetensors"

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.path = str(self.dir)
        if not self.dir.is_dir():
            raise WeightsError(f"{self.path}: not a directory")
        self._files = self._shard_files()
        self._where: dict[str, Path] = {}                 # tensor name -> file
        self._meta: dict[str, tuple[str, tuple]] = {}     # name -> (dtype, shape)
        self._handles: dict[tuple[Path, str], Any] = {}   # (file, framework) -> safe_open
        self._maps: dict[Path, tuple] = {}                # file -> (its bytes mapped, header, data start)
        for file in self._files:
            handle = self._open(file, "numpy")
            for name in handle.keys():
                sl = handle.get_slice(name)
                dtype = sl.get_dtype()
                if name in self._where and self._index is None:  # (an index says which of the two is meant)
                    raise WeightsError(f"{file}: holds tensor {name!r}, which {self._where[name]} holds too")
                if name in self._where and self._where[name] == self.dir / self._index.get(name, ""):
                    continue  # the index names the one read first: that is the tensor
                self._meta[name] = (_ST_DTYPES.get(dtype, dtype.lower()), tuple(sl.get_shape()))
                self._where[name] = file
        # gpt-oss's experts on the hub are MXFP4: each `X_blocks` + `X_scales` pair reads as `X`, in bf16
        # (stored_dtype "mxfp4").
        self._mxfp4 = mxfp4.quantized_names(self._meta)
        for name, (blocks, _) in self._mxfp4.items():
            self._meta[name] = ("mxfp4", mxfp4.dequantized_shape(self._meta[blocks][1]))
            self._where[name] = self._where[blocks]
        if self._index is not None:
            for name, shard in self._index.items():
                if self._where.get(name) != self.dir / shard:
                    raise WeightsError(
                        f"{self.dir / SAFETENSORS_INDEX}: says tensor {name!r} is in "
                        f"{shard}, but {self.dir / shard} does not hold it"
                    )

    def _shard_files(self) -> list[Path]:
        index_path = self.dir / SAFETENSORS_INDEX
        self._index: dict[str, str] | None = None
        if index_path.is_file():
            try:
                index = json.loads(index_path.read_text())
            except (ValueError, RecursionError) as e:
                raise WeightsError(f"{index_path}: not a valid safetensors index ({e})") from None
            if not isinstance(index, dict) or "weight_map" not in index:
                raise WeightsError(f"{index_path}: not a valid safetensors index (an object whose weight_map names "
                                   f"each tensor's shard file; it holds {json.dumps(index)[:80]})")
            self._index = index["weight_map"]
            if not isinstance(self._index, dict) or not all(isinstance(v, str) for v in self._index.values()):
                # (a list of pairs read as the map, a number or null as a shard: a TypeError sorting them)
                held = self._index if not isinstance(self._index, dict) else \
                    next(v for v in self._index.values() if not isinstance(v, str))
                raise WeightsError(f"{index_path}: not a valid safetensors index (its weight_map names each tensor's "
                                   f"shard file; it holds {json.dumps(held)[:80]})")
            files = []
            for shard in sorted(set(self._index.values())):
                if Path(shard).is_absolute() or ".." in Path(shard).parts:
                    # (a shard is a file of the model's folder, as the hub writes them: read nothing from elsewhere;
                    # the hub cache's shards are links out of their folder, but named within it)
                    raise WeightsError(f"{index_path}: not a valid safetensors index (it names a shard outside the "
                                       f"model's folder: {shard})")
                if (self.dir / shard).is_dir():
                    raise WeightsError(f"{self.dir / shard}: is a directory, not a file; shard {shard} is named in "
                                       f"{index_path}")
                if not (self.dir / shard).is_file():
                    raise WeightsError(
                        f"{self.dir / shard}: missing; shard {shard} is named in {index_path} "
                        "(the download may be incomplete)"
                    )
                files.append(self.dir / shard)
            return files
        single = self.dir / SAFETENSORS_FILE
        if single.is_file():
            return [single]
        if single.is_dir():
            raise WeightsError(f"{single}: is a directory, not a file")
        shards = self._unindexed_shards()
        if shards:
            return shards
        present = sorted(p.name for p in self.dir.iterdir())
        ggufs = [p for p in present if p.lower().endswith(".gguf")]
        if ggufs:
            why = f"to read a GGUF here, pass the file itself: {self.dir / ggufs[0]}"
        elif any(p.endswith(".bin") or p.endswith(".pt") for p in present):
            why = "only PyTorch pickle weights (.bin/.pt) are here; linnet reads safetensors"
        else:
            why = f"found: {', '.join(present[:10]) or 'nothing'}"
        raise WeightsError(f"{self.path}: no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} ({why})")

    def _unindexed_shards(self) -> list[Path]:
        """The shards of one NAME-0000i-of-0000N.safetensors set where the index is not there (a download
        that left out the JSON files), each tensor found by reading every shard's header, as vLLM
        reads a directory without an index; [] where there is no one such set."""
        sets: dict[tuple[str, int], set[int]] = {}
        for path in self.dir.glob("*.safetensors"):
            match = _SHARD_NAME.fullmatch(path.name)
            if match:
                sets.setdefault((match[1], int(match[3])), set()).add(int(match[2]))
        if len(sets) != 1:
            return []
        (prefix, count), present = next(iter(sets.items()))
        names = [f"{prefix}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
        missing = [name for i, name in enumerate(names, 1) if i not in present]
        if missing:
            raise WeightsError(f"{self.dir / missing[0]}: missing; shard {names.index(missing[0]) + 1} of {count} "
                               f"(and no {SAFETENSORS_INDEX} to say which tensors are where; the download may "
                               "be incomplete)")
        return [self.dir / name for name in names]

    def _open(self, file: Path, framework: str):
        key = (file, framework)
        if key not in self._handles:
            from safetensors import safe_open

            try:
                str(file).encode()
            except UnicodeEncodeError:  # (Python's stand-ins for the bytes; was "may be truncated or corrupt")
                raise WeightsError(f"{file}: its path holds bytes that are not UTF-8, which the safetensors library "
                                   "cannot open; rename the folder or file") from None
            try:  # (safetensors says "No such file or directory" of a file it may not read)
                with open(file, "rb"):
                    pass
            except OSError as e:
                raise _unreadable(file, e) from None
            try:
                self._handles[key] = safe_open(str(file), framework="pt" if framework == "torch" else "numpy")
            except Exception as e:  # SafetensorError, OSError: truncated, corrupt, unreadable
                detail = _safetensors_overrun(file)
                raise WeightsError(lfs_pointer(file) or f"{file}: cannot read safetensors file ({e}){detail}; "
                                                         "it may be truncated or corrupt") from None
        return self._handles[key]

    def file_of(self, name: str) -> str:
        return str(self._where[name]) if name in self._where else self.path

    def files(self) -> list[str]:
        return [str(f) for f in self._files]

    def names(self) -> list[str]:
        parts = {p for pair in self._mxfp4.values() for p in pair}
        return [n for n in self._meta if n not in parts]

    def __contains__(self, name: str) -> bool:
        return name in self._meta

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._meta:
            raise self._unknown(name)
        return self._meta[name][1]

    def stored_dtype(self, name: str) -> str:
        if name not in self._meta:
            raise self._unknown(name)
        return self._meta[name][0]

    def load(self, name: str, framework: str = "numpy"):
        """The tensor as stored (no dtype change).

        framework="torch" returns a torch tensor straight from the memory map.
        framework="numpy" returns an array; bf16 needs `ml_dtypes` for its dtype.
        """
        _check_framework(framework)
        if name not in self._meta:
            raise self._unknown(name)
        file = self._where[name]
        try:
            if name in self._mxfp4:  # decoded in torch, whichever framework asks
                blocks, scales = (self.load(part, "torch") for part in self._mxfp4[name])
                t = mxfp4.dequantize(blocks, scales)
                if framework == "torch":
                    return t
                import torch

                return t.contiguous().view(torch.int16).numpy().view(_bfloat16(file, name))
            if framework == "torch":
                return self._open(file, "torch").get_tensor(name)
            return self._mapped_numpy(file, name)
        except WeightsError:
            raise
        except Exception as e:
            raise WeightsError(f"{file}: cannot read tensor {name!r} ({e})") from None

    def _mapped_numpy(self, file: Path, name: str) -> np.ndarray:
        """The tensor as a read-only view of the file (its pages are the file's, which the system
        can drop, not a copy in the process's memory: the largest tensor read so had cost its size
        in anonymous memory at load). bf16 is viewed as ml_dtypes' (JAX's) bfloat16, which numpy
        and safetensors' numpy reader lack; a type numpy cannot view goes through that reader."""
        if file not in self._maps:
            header, start = _safetensors_header(file)
            self._maps[file] = (np.memmap(file, dtype=np.uint8, mode="r"), header, start)
        mapped, header, start = self._maps[file]
        code = header[name]["dtype"]
        dtype = _ml_dtype(file, name, code) if code in _ML_DTYPES else _NUMPY_TYPES.get(code)
        if dtype is None:
            return self._open(file, "numpy").get_tensor(name)
        begin, end = header[name]["data_offsets"]
        return mapped[start + begin:start + end].view(dtype).reshape(self._meta[name][1])

    def config(self) -> dict:
        path = self.dir / CONFIG_FILE
        if not path.is_file():
            raise WeightsError(
                f"{self.path}: no {CONFIG_FILE}; a Hugging Face model directory needs one "
                "(download the whole repository, not only the weights)"
            )
        try:
            config = json.loads(path.read_text())
        except (ValueError, RecursionError) as e:  # (RecursionError: arrays nested thousands deep)
            raise WeightsError(f"{path}: not valid JSON ({e})") from None
        except OSError as e:  # (one this user may not read: a bare PermissionError)
            raise _unreadable(path, e) from None
        if not isinstance(config, dict):
            raise WeightsError(f"{path}: holds a JSON {type(config).__name__}, not a config object")
        return with_transformers_defaults(config)


# safetensors' type codes numpy views as they are stored (little-endian), bf16 apart
_NUMPY_TYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "I64": np.dtype("<i8"),
                "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"),
                "BOOL": np.dtype("?")}


# safetensors' types that numpy has not and ml_dtypes (JAX's) gives it; safetensors' own numpy reader
# asks numpy for the float8 ones, and fails with "module 'numpy' has no attribute 'float8_e4m3fn'"
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _ml_dtype(file: Path, name: str, code: str):
    """ml_dtypes' type for safetensors' `code`, or a WeightsError saying why tensor `name` of `file`
    cannot be read."""
    try:
        import ml_dtypes
    except ImportError:
        raise WeightsError(
            f"{file}: tensor {name!r} is {code.lower()}, which numpy cannot hold without the "
            "ml_dtypes package; install it or load with framework='torch'"
        ) from None
    return getattr(ml_dtypes, _ML_DTYPES[code])


def _bfloat16(file: Path, name: str):
    return _ml_dtype(file, name, "BF16")


class _HeaderSizeError(ValueError):
    """A safetensors header whose stated length does not fit in its file."""


def _safetensors_header(file: Path) -> tuple[dict, int]:
    """(a safetensors file's header, where its data starts): an 8-byte little-endian length, then
    that many bytes of JSON whose `data_offsets` count from the end of the header."""
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        size = file.stat().st_size
        if n <= 0 or 8 + n > size:
            raise _HeaderSizeError(f"its header says it is {n} bytes, but the file has {size}")
        return json.loads(f.read(n)), 8 + n


def _safetensors_overrun(file: Path) -> str:
    """", tensor 'x' needs bytes up to N but the file has M" for a file cut short, else ""."""
    try:
        size = file.stat().st_size
        try:
            header, start = _safetensors_header(file)
        except _HeaderSizeError as e:
            return f": {e}" if size >= 8 else ""
        for name, info in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                                 key=lambda kv: kv[1]["data_offsets"][1]):
            end = start + int(info["data_offsets"][1])
            if end > size:
                return (f": tensor {name!r} {info.get('shape')} needs bytes up to {end}, "
                        f"but the file has {size}")
    except Exception:  # the header itself is unreadable: nothing more to say
        return ""
    return ""


# ----------------------------------------------------------------------- GGUF

# GGUF architecture -> (model_type, architectures) for the config we build.
_GGUF_ARCHS = {
    "llama": ("llama", ["LlamaForCausalLM"]),
    "qwen2": ("qwen2", ["Qwen2ForCausalLM"]),
    "qwen3": ("qwen3", ["Qwen3ForCausalLM"]),
    "qwen3moe": ("qwen3_moe", ["Qwen3MoeForCausalLM"]),
    "gpt-oss": ("gpt_oss", ["GptOssForCausalLM"]),
    "gemma3": ("gemma3_text", ["Gemma3ForCausalLM"]),
    "phi3": ("phi3", ["Phi3ForCausalLM"]),
    "olmo2": ("olmo2", ["Olmo2ForCausalLM"]),
    "granite": ("granite", ["GraniteForCausalLM"]),
    "smollm3": ("smollm3", ["SmolLM3ForCausalLM"]),
    "gemma2": ("gemma2", ["Gemma2ForCausalLM"]),
    "phi2": ("phi", ["PhiForCausalLM"]),
    "gpt2": ("gpt2", ["GPT2LMHeadModel"]),
    "deepseek2": ("deepseek_v2", ["DeepseekV2ForCausalLM"]),  # V3's where its experts are scored by sigmoid
}

# a split GGUF's keys (llama.cpp's gguf-split), and how its files are named after their common prefix
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_NAME = "-{:05d}-of-{:05d}.gguf"


# metadata keys llama.cpp reads as a whole number, besides every tokenizer.ggml.*_token_id (the
# vocabulary's arrays are checked by `gguf_tokenizer`, which reads them)
_GGUF_INTEGERS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)


def _read_as_integer(key: str) -> bool:
    return key in _GGUF_INTEGERS or (key.startswith("tokenizer.ggml.") and key.endswith("_token_id"))


def _open_gguf(path: str):
    from . import gguf_file  # needs the gguf package, which only GGUF files do

    try:
        return gguf_file.GGUFFile(path)
    except gguf_file.GGUFFormatError as e:  # truncated, not GGUF, unsupported version
        raise WeightsError(lfs_pointer(Path(path)) or f"{path}: cannot read GGUF file ({e}); it may be truncated "
                                                       f"or corrupt") from None
    except OSError as e:  # (one this user may not read: a bare PermissionError)
        raise _unreadable(path, e) from None


# the first line of a file Git LFS stands in for the real one (a clone made without `git lfs`)
LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def _unreadable(file, err: OSError) -> WeightsError:
    """The error for a file of the checkpoint that cannot be opened (one this user may not read): named, with
    the system's reason, where Python's own (a bare PermissionError) or a library's ("No such file") was raised."""
    return WeightsError(f"{file}: cannot be read ({err.strerror or err})")


def lfs_pointer(file: Path) -> str | None:
    """What to say of `file` where it is a Git LFS pointer (a repository cloned without its LFS files holds
    these, some hundred bytes, in place of the weights), else None."""
    try:
        with open(file, "rb") as f:
            if f.read(len(LFS_POINTER)) != LFS_POINTER:
                return None
        size = file.stat().st_size
    except OSError:
        return None
    return (f"{file}: a Git LFS pointer ({size} bytes), not the file it stands for: the repository was cloned "
            f"without its LFS files; fetch them (`git lfs pull` in the clone), or download the model (`hf download`)")


# keys (`<arch>.key`) every GGUF file holds, and those every file of some architectures does
_GGUF_KEYS = ("embedding_length", "block_count", "attention.head_count")
_GGUF_ARCH_KEYS = {"gemma3": ("feed_forward_length",), "phi2": ("attention.layer_norm_epsilon", "rope.dimension_count"),
                   "gpt2": ("attention.layer_norm_epsilon", "feed_forward_length", "context_length"),
                   "deepseek2": ("attention.kv_lora_rank", "rope.dimension_count", "leading_dense_block_count",
                                 "expert_count", "expert_used_count", "expert_feed_forward_length",
                                 "expert_shared_count")}


def _scoring_func(gating_func: int | None) -> str | int | None:
    """transformers' scoring_func for llama.cpp's deepseek2 expert_gating_func, by gguf's own names for its
    values (ExpertGatingFuncType: 1 softmax, 2 sigmoid); a value it does not name comes back as it is
    (refused by the card), none as none."""
    from gguf.constants import ExpertGatingFuncType

    try:
        return ExpertGatingFuncType(gating_func).name.lower()
    except ValueError:
        return gating_func


# GGUF architecture -> how the names of the norm weights llama.cpp's converter stores as 1 + w end:
# Gemma's RMSNorm multiplies by 1 + w, llama.cpp's by its weight, so the converter adds the 1;
# the architecture (as the Hugging Face checkpoint) holds w
NORMS_PLUS_ONE = {"gemma3": "norm.weight", "gemma2": "norm.weight"}

# llama.cpp's gemma3 takes no pattern or local rope from the file: a window in five layers of every
# six, and the sliding layers' rope unscaled at base 10000
LLAMA_CPP_GEMMA3_PATTERN = 6
LLAMA_CPP_GEMMA3_LOCAL_THETA = 10000.0

# llama.cpp's smollm3 takes no NoPE layers from the file: it rotates nothing in every fourth layer
LLAMA_CPP_SMOLLM3_NO_ROPE_INTERVAL = 4

# llama.cpp's gemma2 takes no layer kinds from the file: sliding and full layers alternate, the first
# sliding; it caps the attention scores and the logits always, at the file's caps or these
LLAMA_CPP_GEMMA2_PATTERN = 2
LLAMA_CPP_GEMMA2_CAPS = (50.0, 30.0)


def llama_cpp_gemma2_query_scalar(dim: int, heads: int, head_dim: int, layers: int) -> int:
    """The query_pre_attn_scalar whose inverse square root llama.cpp's gemma2 scales queries by: dim /
    heads for the 46-layer model (27B), head_dim for the others, by the layer count."""
    return dim // heads if layers == 46 else head_dim


def llama_cpp_gemma3_query_scalar(dim: int, heads: int, head_dim: int, layers: int) -> int:
    """The query_pre_attn_scalar whose inverse square root llama.cpp's gemma3 scales queries by: it
    goes by the layer count, as Google's reference code by the model: dim / heads for the 62-layer
    model (27B), head_dim for the others."""
    return dim // heads if layers == 62 else head_dim

# gpt-oss's experts: llama.cpp keeps gate and up apart, the architecture (as the Hugging Face
# checkpoint) takes them as one tensor whose rows interleave gate, up, gate, up, ...
_JOINED = ("ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps")

# DeepSeek's kv_b_proj: llama.cpp's deepseek2 files from before its MLA form hold it whole, as transformers
# does ([heads * (nope + v), kv_lora_rank]); the current form splits it into each head's key rows, transposed,
# and its value rows, the parts the architecture reads
_KV_B = ("attn_kv_b", "attn_k_b", "attn_v_b")


class GGUFCheckpoint(Checkpoint):
    """A llama.cpp GGUF file.

    The header is read by `gguf_file`; `load` dequantizes to float32
    (`dequantize`: Linnet's C decoders for the common block types, the gguf
    package's own routines for the rest). Names stay GGUF's
    (`blk.0.attn_q.weight`), and q/k rows stay in llama.cpp's rope order:
    see `transforms.unpermute_rope`. Two of llama.cpp's layouts are read
    as the architecture's: gpt-oss's gate and up experts joined
    (`_JOINED`), and Gemma 3's norm weights less the 1 llama.cpp's
    converter added (`NORMS_PLUS_ONE`). A deepseek2 file from before
    llama.cpp's MLA form is read as that form (`_KV_B`).
    """

    format = "gguf"

    def __init__(self, file: str | os.PathLike):
        self.path = str(file)
        if not Path(file).is_file():
            raise WeightsError(f"{self.path}: no such file")
        if importlib.util.find_spec("gguf") is None:
            raise WeightsError(f"{self.path}: reading GGUF files needs the 'gguf' package (pip install gguf)")
        self._file = _open_gguf(self.path)
        self._tensors = dict(self._file.tensors)
        self._split_files: dict[str, Any] = {}  # a tensor's split (a file past the first) -> its GGUFFile
        self._read_splits()
        self._joined: dict[str, tuple[str, str]] = {}  # a gpt-oss name -> its gate and up tensors
        self._plus_one = NORMS_PLUS_ONE.get(self.architecture)  # how the names of norms stored as 1 + w end
        if self.architecture == "gpt-oss":
            gate, up, joined = _JOINED
            for name in list(self._tensors):
                pair = (name, name.replace(gate, up))
                if f".{gate}." in name and pair[1] in self._tensors:
                    self._joined[name.replace(gate, joined)] = pair
        self._kv_b: dict[str, tuple[str, int, int]] = {}  # attn_k_b / attn_v_b -> attn_kv_b, its rows of a head
        self._kv_b_heads = (0, 0)  # (heads, each head's rows of attn_kv_b)
        if self.architecture == "deepseek2":
            self._split_kv_b()

    def _split_kv_b(self) -> None:
        """A deepseek2 file from before llama.cpp's MLA form (no `_mla` lengths; key_length and value_length
        the heads' own widths, nope + rope and v; kv_b_proj whole as attn_kv_b) is read as the current form:
        attn_k_b each head's key rows, transposed ([heads, kv_lora_rank, nope]), attn_v_b its value rows
        ([heads, v, kv_lora_rank]), as llama.cpp's convert_hf_to_gguf.py now splits them."""
        def get(key):
            return self.metadata(f"deepseek2.{key}")

        widths = (get("attention.head_count"), get("attention.key_length"), get("attention.value_length"),
                  get("rope.dimension_count"))
        if get("attention.key_length_mla") is not None or None in widths:
            return
        heads, key, value, rotated = widths
        nope = key - rotated
        self._kv_b_heads = (heads, nope + value)
        whole, key_part, value_part = _KV_B
        for name in self._tensors:
            if f".{whole}." in name:
                self._kv_b[name.replace(whole, key_part)] = (name, 0, nope)
                self._kv_b[name.replace(whole, value_part)] = (name, nope, nope + value)

    def _kv_b_part(self, name: str, whole: np.ndarray) -> np.ndarray:
        """attn_k_b or attn_v_b (`name`) from its layer's attn_kv_b (`whole`: a [rows, kv_lora_rank] array)."""
        from .transforms import split_heads

        stored, start, stop = self._kv_b[name]
        heads, rows = self._kv_b_heads
        try:
            part = split_heads(whole, heads, rows, start, stop)
        except ValueError as e:
            raise WeightsError(f"{self.path}: {stored!r} of shape {tuple(whole.shape)}: {e}") from None
        return part.transpose(0, 2, 1) if start == 0 else part

    def _read_splits(self) -> None:
        """The tensors of the other files of a split GGUF (`split.count` files, as llama.cpp's
        gguf-split and converter write a large model: NAME-00001-of-0000N.gguf holds the metadata and
        the first tensors), found by their names as llama.cpp finds them from the first file."""
        count, number = self.metadata(SPLIT_COUNT, 0), self.metadata(SPLIT_NO, 0)
        if count <= 1:
            return
        first = Path(self.path)
        ending = SPLIT_NAME.format(number + 1, count)
        if not first.name.endswith(ending):
            raise WeightsError(f"{self.path}: split {number + 1} of {count} of a split GGUF, whose files must be named "
                               f"as llama.cpp names them (PREFIX{SPLIT_NAME.format(1, count)}, ...) to be found")
        prefix = first.name[:-len(ending)]
        if number != 0:
            raise WeightsError(f"{self.path}: split {number + 1} of {count} of a split GGUF; pass its first file, "
                               f"{first.with_name(prefix + SPLIT_NAME.format(1, count))}")
        for i in range(1, count):
            path = first.with_name(prefix + SPLIT_NAME.format(i + 1, count))
            if not path.is_file():
                raise WeightsError(f"{path}: missing; split {i + 1} of {count} of {self.path} (the download may be "
                                   "incomplete)")
            split = _open_gguf(str(path))
            if (split.value(SPLIT_NO), split.value(SPLIT_COUNT)) != (i, count):
                raise WeightsError(f"{path}: says it is split {split.value(SPLIT_NO, -1) + 1} of "
                                   f"{split.value(SPLIT_COUNT)}, not {i + 1} of {count} as its name does")
            for name, tensor in split.tensors.items():
                if name in self._tensors:
                    holder = self._split_files[name].path if name in self._split_files else self.path
                    raise WeightsError(f"{path}: holds tensor {name!r}, which {holder} holds too")
                self._tensors[name] = tensor
                self._split_files[name] = split
        expected = self.metadata(SPLIT_TENSORS, len(self._tensors))
        if expected != len(self._tensors):
            raise WeightsError(f"{self.path}: its {count} splits hold {len(self._tensors)} tensors, and the first says "
                               f"{expected}")

    def _stored(self, name: str) -> str:
        """The stored tensor a name is read from (the first of a joined pair)."""
        return self._kv_b[name][0] if name in self._kv_b else self._joined.get(name, (name,))[0]

    def file_of(self, name: str) -> str:
        name = self._stored(name)
        return self._split_files[name].path if name in self._split_files else self.path

    def files(self) -> list[str]:
        return [self.path, *dict.fromkeys(f.path for f in self._split_files.values())]

    # -- metadata

    def fields(self) -> dict:
        """The metadata's fields (`gguf_file.Field`: value types included), for copying them out."""
        return dict(self._file.fields)

    def metadata(self, key: str, default: Any = None) -> Any:
        """A metadata value by its GGUF key, e.g. "llama.block_count". The token ids and a split's numbers
        (`_read_as_integer`) are checked to be whole numbers: a damaged or hand-made file's text there was
        a TypeError deep in a reader."""
        value = self._file.value(key, default)
        if key in self._file.fields and _read_as_integer(key) and (not isinstance(value, int) or isinstance(value, bool)):
            raise WeightsError(f"{self.path}: its GGUF metadata {key} is {repr(value)[:80]}, where llama.cpp reads a "
                               "whole number")
        return value

    @property
    def architecture(self) -> str:
        return self.metadata("general.architecture", "")

    # -- tensors

    def names(self) -> list[str]:
        parts = {p for pair in self._joined.values() for p in pair} | {p for p, _, _ in self._kv_b.values()}
        return [n for n in self._tensors if n not in parts] + list(self._joined) + list(self._kv_b)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors or name in self._joined or name in self._kv_b

    def _tensor(self, name: str):
        t = self._tensors.get(name)
        if t is None:
            raise self._unknown(name)
        return t

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._joined:  # gate's rows and up's, interleaved
            gate = self.shape(self._joined[name][0])
            return (gate[0], 2 * gate[1], *gate[2:])
        if name in self._kv_b:  # (cut from a view of no bytes: checked as `load` checks it)
            return self._kv_b_part(name, np.broadcast_to(np.uint8(0), self.shape(self._kv_b[name][0]))).shape
        return self._tensor(name).shape

    def stored_dtype(self, name: str) -> str:
        return self._tensor(self._stored(name)).type.name.lower()

    def load(self, name: str, framework: str = "numpy", dtype: str | None = None):
        """Float32 for every float or quantized type (integers keep theirs).

        An F32 tensor comes back as a read-only view of the file for numpy;
        torch gets a private copy, as torch tensors are writable.
        `dtype="bf16"`: a quantized tensor whose blocks Linnet's C decodes comes back in bf16
        instead (torch's bfloat16, ml_dtypes' for numpy), decoded and rounded in one pass: the
        bits of the float32 tensor rounded to bf16 as torch rounds (`gguf_blocks.round_to_bf16`); so
        do gpt-oss's joined pairs and an old DeepSeek file's kv_b parts of such tensors, assembled in
        bf16 (a float32 copy of an expert pair is 2 GB). Any other tensor comes back as without it.
        """
        _check_framework(framework)
        bf16 = dtype == "bf16" and self._decodes_to_bf16(name)
        if name in self._joined:
            gate, up = (self._array(part, bf16) for part in self._joined[name])
            arr = np.empty(self.shape(name), dtype=gate.dtype)
            arr[:, 0::2], arr[:, 1::2] = gate, up
        elif name in self._kv_b:
            arr = np.ascontiguousarray(self._kv_b_part(name, self._array(self._kv_b[name][0], bf16)))
        else:
            arr = self._array(name, bf16)
        if bf16:
            if framework == "numpy":
                return arr.view(_bfloat16(Path(self.path), name))
            import torch

            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        if self._plus_one and name.endswith(self._plus_one):
            arr = arr - np.float32(1.0)
        if framework == "numpy":
            return arr
        import torch

        if not arr.flags.writeable:
            arr = arr.copy()
        return torch.from_numpy(arr)

    def blocks(self, name: str, qtypes) -> tuple | None:
        """(type, [rows, row bytes] uint8: the file's own bytes, not decoded) of a tensor stored as
        one of `qtypes`, for a kernel that reads the blocks (`nest.quantized`); None for any other
        tensor, and for one `load` rewrites (a joined pair, a norm less one, a big-endian file's)."""
        t = self._tensors.get(name)
        if t is None or t.type not in qtypes or t.data.dtype != np.uint8 or name in self._joined or \
                (self._plus_one and name.endswith(self._plus_one)) or \
                self._split_files.get(name, self._file).byte_order != "<":
            return None
        return t.type, t.data.reshape(-1, t.data.shape[-1])

    def _decodes_to_bf16(self, name: str) -> bool:
        """Whether `load(name, dtype="bf16")` decodes straight to bf16: every tensor it is read from (a
        joined pair's two, a DeepSeek kv_b part's attn_kv_b) quantized in a type Linnet's C decodes, and
        not a norm less one."""
        from linnet.kernels import gguf_blocks

        if name not in self or (self._plus_one and name.endswith(self._plus_one)):
            return False
        parts = self._joined.get(name) or ((self._kv_b[name][0],) if name in self._kv_b else (name,))
        for part in parts:
            t = self._tensors.get(part)
            if t is None or t.data.dtype != np.uint8 or not gguf_blocks.decodes(t.type) or \
                    self._split_files.get(part, self._file).byte_order != "<":
                return False
        return True

    def _array(self, name: str, bf16: bool = False) -> np.ndarray:
        t = self._tensor(name)
        if t.data.dtype != np.uint8:  # plain numbers (`gguf_file.PLAIN_TYPES`), not blocks of bytes
            native = t.data.dtype.newbyteorder("=") if t.data.dtype.kind == "i" else np.float32
            return t.data.astype(native, copy=False)  # the file's own bytes where they are already so
        if self._split_files.get(name, self._file).byte_order != "<":
            raise WeightsError(f"{self.path}: tensor {name!r} is {t.type.name} in a big-endian GGUF, whose blocks "
                               "cannot be decoded here")
        try:
            arr = dequantize(t.data, t.type, bf16=bf16)  # MXFP4 (gpt-oss's experts) too
        except NotImplementedError:
            raise WeightsError(
                f"{self.path}: tensor {name!r} is {t.type.name}, which this gguf package cannot dequantize"
            ) from None
        return arr.reshape(t.shape) if bf16 else np.asarray(arr, dtype=np.float32).reshape(t.shape)

    # -- config

    def config(self) -> dict:
        """A Hugging Face config built from the GGUF metadata.

        Llama 3.x GGUFs carry their rope scaling as a `rope_freqs.weight`
        tensor (a divisor per frequency), not as metadata; the llama3
        parameters that give that table become `rope_scaling`.
        """
        arch = self.architecture
        if not arch:
            raise WeightsError(f"{self.path}: no general.architecture in the GGUF metadata")

        if arch not in _GGUF_ARCHS:
            raise WeightsError(f"{self.path}: GGUF architecture {arch!r} is not supported; supported: "
                               f"{', '.join(_GGUF_ARCHS)}")

        def get(key, default=None):  # (each a number, but the rope scaling's type)
            value = self.metadata(f"{arch}.{key}", default)
            # (a bool is a flag's, a number too; text or a list was a TypeError, or a message naming no file)
            if value is not None and key != "rope.scaling.type" and not isinstance(value, (int, float)):
                raise WeightsError(f"{self.path}: its GGUF metadata {arch}.{key} is {repr(value)[:80]}, where "
                                   f"llama.cpp reads a number")
            return value

        absent = [key for key in _GGUF_KEYS + _GGUF_ARCH_KEYS.get(arch, ()) if get(key) is None]
        if absent:
            raise WeightsError(f"{self.path}: the GGUF metadata has no {arch}.{absent[0]}, which every {arch} file holds")
        for key in ("embedding_length", "block_count", "attention.head_count", "attention.head_count_kv"):
            count = get(key)  # (said here by the GGUF's own key, before the config made of them is read)
            if count is not None and (isinstance(count, bool) or not float(count).is_integer() or count < 1):
                raise WeightsError(f"{self.path}: its GGUF metadata {arch}.{key} is {count!r}, where llama.cpp reads "
                                   f"a count of 1 or more")
        heads = get("attention.head_count")
        hidden = get("embedding_length")
        if heads % get("attention.head_count_kv", heads):
            raise WeightsError(f"{self.path}: its GGUF metadata {arch}.attention.head_count ({heads}) is no "
                               f"multiple of {arch}.attention.head_count_kv ({get('attention.head_count_kv')}): the "
                               f"query heads cannot share the key/value heads evenly")
        tokens = self.metadata("tokenizer.ggml.tokens")
        if tokens is not None and not isinstance(tokens, list):  # (was a TypeError from len())
            raise WeightsError(f"{self.path}: its GGUF metadata tokenizer.ggml.tokens is {repr(tokens)[:80]}, not an "
                               "array of strings")
        vocab = get("vocab_size") or (len(tokens) if tokens else None)
        if vocab is None and "token_embd.weight" in self._tensors:
            vocab = self.shape("token_embd.weight")[0]
        model_type, architectures = _GGUF_ARCHS.get(arch, (arch, None))
        if arch == "llama" and get("expert_count"):  # llama.cpp writes Mixtral as llama with experts
            model_type, architectures = "mixtral", ["MixtralForCausalLM"]
        if arch == "deepseek2" and _scoring_func(get("expert_gating_func")) == "sigmoid":
            model_type, architectures = "deepseek_v3", ["DeepseekV3ForCausalLM"]

        cfg: dict[str, Any] = {"model_type": model_type}
        if architectures:
            cfg["architectures"] = architectures
        cfg.update(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=get("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=get("attention.head_count_kv", heads),
            intermediate_size=get("feed_forward_length"),
            rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
            rope_theta=get("rope.freq_base", 10000.0),
            max_position_embeddings=get("context_length"),
            tie_word_embeddings="output.weight" not in self._tensors,
        )
        head_dim = get("attention.key_length") or (hidden // heads if hidden and heads else None)
        if head_dim is not None:
            cfg["head_dim"] = head_dim
        if model_type == "gpt_oss":
            cfg.update(num_local_experts=get("expert_count"), num_experts_per_tok=get("expert_used_count"),
                       intermediate_size=get("expert_feed_forward_length"),
                       sliding_window=get("attention.sliding_window"))
        if model_type == "qwen3_moe":  # llama.cpp always renormalizes the chosen experts' weights
            cfg.update(num_experts=get("expert_count"), num_experts_per_tok=get("expert_used_count"),
                       moe_intermediate_size=get("expert_feed_forward_length"), norm_topk_prob=True)
        if model_type == "mixtral":
            cfg.update(num_local_experts=get("expert_count"), num_experts_per_tok=get("expert_used_count"))
        if arch == "deepseek2":
            cfg.pop("head_dim", None)  # (key_length: the latent's and the rotated key's, not a head's)
            cfg.update(self._deepseek2_config(get, model_type))
        if model_type == "gemma3_text":
            cfg.update(self._gemma3_config(get, cfg))
        if model_type == "phi3" and "rope_factors_long.weight" in self._tensors:
            # the 128k models' longrope, which llama.cpp reads as these tables (and no window: its phi3
            # attends over whole rows whatever the file's sliding_window says)
            cfg["rope_scaling"] = {"rope_type": "longrope"}
        if model_type == "granite":  # llama.cpp scales nothing where a key is absent, and attention by 1 / sqrt(head_dim)
            cfg.update(embedding_multiplier=get("embedding_scale", 1.0), residual_multiplier=get("residual_scale", 1.0),
                       attention_multiplier=get("attention.scale") or cfg["head_dim"] ** -0.5,
                       logits_scaling=get("logit_scale", 1.0))
        if model_type == "smollm3":
            cfg["no_rope_layer_interval"] = LLAMA_CPP_SMOLLM3_NO_ROPE_INTERVAL
        if model_type == "gemma2":
            cfg.update(self._gemma2_config(get, cfg))
        if model_type == "phi":  # LayerNorms; rotary over the file's rope.dimension_count of each head, NeoX-wise
            cfg.update(layer_norm_eps=get("attention.layer_norm_epsilon"), hidden_act="gelu_new", qk_layernorm=False,
                       partial_rotary_factor=get("rope.dimension_count") / cfg["head_dim"])
        if model_type == "gpt2":  # its position table as long as the file's context; its MLP feed_forward_length wide
            cfg.update(layer_norm_epsilon=get("attention.layer_norm_epsilon"), n_inner=cfg["intermediate_size"],
                       n_positions=cfg["max_position_embeddings"], activation_function="gelu_new")
        if model_type in ("llama", "mixtral", "granite", "smollm3", "deepseek_v2", "deepseek_v3"):
            cfg["hidden_act"] = "silu"
            cfg["attention_bias"] = "blk.0.attn_q.bias" in self._tensors
            cfg["mlp_bias"] = "blk.0.ffn_up.bias" in self._tensors
        scaling = self._rope_scaling(get) or self._llama3_scaling(cfg)
        if scaling and model_type == "gpt_oss":
            # llama.cpp's keys hold no YaRN betas or truncation: llama.cpp fixes them at gpt-oss's betas and
            # rounds the ramp, where gpt-oss (and Linnet's card, as transformers) does not round it
            scaling.update(beta_fast=32.0, beta_slow=1.0, truncate=False)
        if scaling and arch == "deepseek2" and scaling["rope_type"] == "yarn":
            # llama.cpp's deepseek2 takes mscale and mscale_all_dim equal, the file holding 0.1 times them (in
            # f32: rounded back to the card's digits); none: transformers' default, which llama.cpp does not compute
            all_dim = round(get("rope.scaling.yarn_log_multiplier", 0.0) / 0.1, 6)
            if all_dim:
                scaling.update(mscale=all_dim, mscale_all_dim=all_dim)
            else:
                scaling["attention_factor"] = 1.0  # (llama.cpp rotates unscaled: refused as the card derives it)
        if scaling:
            cfg["rope_scaling"] = scaling
        for key in ("bos", "eos", "padding"):
            token_id = self.metadata(f"tokenizer.ggml.{key}_token_id")
            if token_id is not None:
                cfg["pad_token_id" if key == "padding" else f"{key}_token_id"] = token_id
        return {k: v for k, v in cfg.items() if v is not None}

    def _deepseek2_config(self, get, model_type: str) -> dict:
        """DeepSeek's config as llama.cpp's deepseek2 reads the file, in the form its converter writes it from
        transformers' (MLA as one key/value head: the heads' own widths under the `_mla` lengths, kv_b_proj
        as attn_k_b and attn_v_b), or in the form from before it (no `_mla` lengths: the heads' widths under
        key_length and value_length, kv_b_proj whole as attn_kv_b, read as the parts: `_split_kv_b`).
        A file in neither form is refused."""
        head, value = get("attention.key_length_mla"), get("attention.value_length_mla")
        if head is None and value is None and self._kv_b:
            head, value = get("attention.key_length"), get("attention.value_length")
        if head is None or value is None or "blk.0.attn_k_b.weight" not in self:
            raise WeightsError(f"{self.path}: a deepseek2 GGUF in neither llama.cpp's MLA form (attn_k_b and "
                               f"attn_v_b tensors, deepseek2.attention.key_length_mla / value_length_mla) nor the "
                               f"form from before it (attn_kv_b, key_length / value_length); convert the checkpoint "
                               f"again with a current convert_hf_to_gguf.py")
        rotated, groups = get("rope.dimension_count"), get("expert_group_count", 1)
        topk = "noaux_tc" if model_type == "deepseek_v3" else "greedy" if groups <= 1 else "group_limited_greedy"
        return {"q_lora_rank": get("attention.q_lora_rank") or None, "kv_lora_rank": get("attention.kv_lora_rank"),
                "qk_rope_head_dim": rotated, "qk_nope_head_dim": head - rotated, "v_head_dim": value,
                "n_routed_experts": get("expert_count"), "num_experts_per_tok": get("expert_used_count"),
                "moe_intermediate_size": get("expert_feed_forward_length"),
                "n_shared_experts": get("expert_shared_count"),
                "first_k_dense_replace": get("leading_dense_block_count"),
                "routed_scaling_factor": get("expert_weights_scale", 1.0),
                "norm_topk_prob": bool(get("expert_weights_norm", False)),
                "scoring_func": _scoring_func(get("expert_gating_func", 1)),  # (none written: softmax)
                "n_group": groups, "topk_group": get("expert_group_used_count", 1), "topk_method": topk}

    @staticmethod
    def _gemma3_config(get, cfg: dict) -> dict:
        """Gemma 3's config as llama.cpp's gemma3 reads the file: a window (where the file has one) in
        five layers of every six, the sliding layers' rope at base 10000, the file's base and scaling
        the full-attention layers', queries scaled as `llama_cpp_gemma3_query_scalar` says. llama.cpp
        caps the logits (final_logit_softcapping) only in a file without a window. The layers' kinds are
        the pattern, not a list of each layer's (a file's block_count is checked against its tensors later)."""
        window, layers = get("attention.sliding_window") or 0, cfg["num_hidden_layers"]
        pattern = LLAMA_CPP_GEMMA3_PATTERN if window else 1  # 1: every layer attends to its whole row
        scalar = llama_cpp_gemma3_query_scalar(cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], layers)
        return {"sliding_window": window or None, "sliding_window_pattern": pattern,
                "rope_local_base_freq": LLAMA_CPP_GEMMA3_LOCAL_THETA, "query_pre_attn_scalar": scalar,
                "hidden_activation": "gelu_pytorch_tanh",
                "final_logit_softcapping": None if window else get("final_logit_softcapping")}

    @staticmethod
    def _gemma2_config(get, cfg: dict) -> dict:
        """Gemma 2's config as llama.cpp's gemma2 reads the file: its window (4096 where it has none) in
        every other layer from the first, queries scaled as `llama_cpp_gemma2_query_scalar` says, both
        caps the file's (llama.cpp's defaults where it has none). Its layers alternate as gemma2's do where
        a config lists none (LLAMA_CPP_GEMMA2_PATTERN): no list of each layer's kind."""
        layers = cfg["num_hidden_layers"]
        attn_cap, final_cap = LLAMA_CPP_GEMMA2_CAPS
        return {"sliding_window": get("attention.sliding_window") or 4096,
                "query_pre_attn_scalar": llama_cpp_gemma2_query_scalar(cfg["hidden_size"], cfg["num_attention_heads"],
                                                                       cfg["head_dim"], layers),
                "attn_logit_softcapping": get("attn_logit_softcapping", attn_cap),
                "final_logit_softcapping": get("final_logit_softcapping", final_cap),
                "hidden_activation": "gelu_pytorch_tanh"}

    # tensors that are config, not weights: the card reads them as `rope_scaling`
    config_tensors = ("rope_freqs.weight",)

    def _llama3_scaling(self, cfg: dict) -> dict | None:
        from linnet.rope_tables import llama3_from_divisors

        if "rope_freqs.weight" not in self._tensors or "head_dim" not in cfg:
            return None
        params = llama3_from_divisors(self.load("rope_freqs.weight"), cfg["head_dim"], cfg["rope_theta"])
        if params is None:
            raise WeightsError(f"{self.path}: its rope_freqs.weight table is not a llama3 rope scaling; "
                               "Linnet cannot express it")
        return {"rope_type": "llama3", "factor": params["factor"], "low_freq_factor": params["low_freq_factor"],
                "high_freq_factor": params["high_freq_factor"],
                "original_max_position_embeddings": params["original_max"]}

    @staticmethod
    def _rope_scaling(get) -> dict | None:
        kind = get("rope.scaling.type")
        factor = get("rope.scaling.factor")
        if kind in (None, "none") or factor is None:
            return None
        scaling: dict[str, Any] = {"rope_type": kind, "factor": float(factor)}
        original = get("rope.scaling.original_context_length")
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        attn = get("rope.scaling.attn_factor")
        if attn is not None:
            scaling["attention_factor"] = float(attn)
        return scaling


SPLIT_BYTES = 1 << 22  # a tensor this size or more is decoded on every core


def dequantize(blocks: np.ndarray, qtype, bf16: bool = False) -> np.ndarray:
    """A quantized tensor's rows of blocks ([..., row bytes], uint8) as float32 [rows, row values],
    a share of the rows on each core. Linnet's C decoders (`kernels.gguf_blocks`: the common types,
    bit for bit as gguf's) take about 1 ns a value; other types, or where the C is not built, go
    through gguf's own numpy decoders (about 10 ns; their numpy operations let go of the GIL too).
    An 8B model's weights are 450 4096 x 4096 matrices: 1.3 minutes on one core through gguf's.
    `bf16` (where `gguf_blocks.decodes` the type): rounded to bf16 as they are decoded, uint16 [rows,
    row values] holding the bits, without the float32 tensor between."""
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.quants import dequantize as numpy_decode

    from linnet.kernels import gguf_blocks

    rows = blocks.reshape(-1, blocks.shape[-1])
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if bf16 and not gguf_blocks.decodes(qtype):
        raise ValueError(f"{qtype.name} is not decoded to bf16 here (gguf_blocks.decodes)")
    out = np.empty((len(rows), rows.shape[1] // block_bytes * block), np.uint16 if bf16 else np.float32)
    if gguf_blocks.decodes(qtype):
        def decode(lo: int, hi: int) -> None:
            gguf_blocks.decode(rows[lo:hi], qtype, out[lo:hi], bf16=bf16)
    else:
        def decode(lo: int, hi: int) -> None:
            out[lo:hi] = numpy_decode(rows[lo:hi], qtype)
    over_rows(len(rows), rows.nbytes, decode)
    return out


def over_rows(rows: int, nbytes: int, work) -> None:
    """work(lo, hi) over rows [0, rows) of a tensor of `nbytes`: on this thread below SPLIT_BYTES
    (a share of a small tensor is not worth a thread's waking), else a share of the rows on each core."""
    workers = _cores()
    if workers == 1 or nbytes < SPLIT_BYTES or rows < 2:
        work(0, rows)
        return
    bounds = np.linspace(0, rows, min(4 * workers, rows) + 1).astype(int)
    # list(): a worker's error is raised here
    list(_decoders().map(lambda i: work(bounds[i], bounds[i + 1]), range(len(bounds) - 1)))


@functools.cache
def _decoders():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=_cores(), thread_name_prefix="linnet-dequantize")


# --------------------------------------------------------------------- choose


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """A directory -> safetensors; a *.gguf file -> GGUF; anything else is an error."""
    p = Path(path)
    if p.is_dir():
        return SafetensorsCheckpoint(p)
    if p.is_file():
        if p.suffix.lower() == ".gguf":
            return GGUFCheckpoint(p)
        if p.name in (SAFETENSORS_FILE, SAFETENSORS_INDEX, CONFIG_FILE):
            return SafetensorsCheckpoint(p.parent)
        if p.suffix == ".safetensors":  # a shard (model-00001-of-00004.safetensors) holds only some of the tensors
            raise WeightsError(f"{p}: one safetensors file; Linnet reads the model directory it is in (config.json "
                               f"and {SAFETENSORS_FILE} or {SAFETENSORS_INDEX}): give {p.parent}")
        raise WeightsError(
            f"{p}: not a checkpoint linnet can read; give a Hugging Face model directory "
            "(config.json + *.safetensors) or a .gguf file"
        )
    raise WeightsError(f"{p}: no such file or directory")
