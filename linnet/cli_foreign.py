"""Flags of vLLM's and llama.cpp's commands that `linnet` has not, each with what Linnet has instead.

A vLLM or llama.cpp user types them from habit; argparse alone would answer "unrecognized
arguments" with the top command's usage. Flags that mean the same here are aliases in the parser
itself (`--max-model-len`, `-n`, ...); these are the ones refused, with why and what to use.
"""

from __future__ import annotations

import argparse

_POSITIONAL = "the card (a name, a .linnet file, a model directory or a .gguf) is the command's first argument"
_NO_DOWNLOADS = ("Linnet downloads nothing: it reads a local model directory or .gguf (--weights), or the Hugging "
                 "Face cache (fetch into it with `hf download REPO`)")
_TENSOR_PARALLEL = ("Linnet spreads a model over devices by tensor parallelism alone: --shards N (vLLM's "
                    "--tensor-parallel-size, -tp) with --backend jax")
_ON_DEVICE = "the whole model runs on --device; there are no layers to offload"

SERVE = {
    ("--model", "-m"): f"{_POSITIONAL}: linnet serve CARD [flags]",
    ("--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp"): _TENSOR_PARALLEL,
    ("--enable-lora", "--lora-modules", "--max-loras", "--max-lora-rank"): "Linnet serves no LoRA adapters",
    ("--download-dir", "--revision", "--hf-token"): _NO_DOWNLOADS,
    ("--enable-log-requests",): "Linnet logs no request's content; uvicorn's access log has a line for each request",
    # llama-server's
    ("--ctx-size", "-c"): "use --max-seq (vLLM's --max-model-len): positions per cache row",
    ("--parallel", "-np"): "use --batch (vLLM's --max-num-seqs): cache rows, the requests in flight",
    ("--n-gpu-layers", "-ngl", "--gpu-layers"): _ON_DEVICE,
}

GENERATE = {
    ("--model", "-m"): f"{_POSITIONAL}: linnet generate CARD PROMPT [flags]",
    ("--prompt", "-p"): "the prompt is the command's second argument: linnet generate CARD PROMPT [flags]",
    ("--file", "-f"): "a prompt from a file is read from standard input: linnet generate CARD - < FILE",
    ("--conversation", "-cnv", "--interactive", "-i"): "linnet generate answers one prompt; --chat wraps it in "
                                                      "the model's chat template, and `linnet serve` holds a chat",
    ("--n-gpu-layers", "-ngl", "--gpu-layers"): _ON_DEVICE,
    ("--flash-attn", "-fa"): "Linnet picks its attention kernels itself (fused ones with --numerics fast, the default)",
    ("--cache-type-k", "-ctk", "--cache-type-v", "-ctv"): "the cache holds the model's type (--dtype); a quantized "
                                                         "cache is not built",
    ("--threads", "-t"): "the CPU kernels use every core this process may run on (taskset -c limits them)",
    ("--reverse-prompt", "-r"): "use --stop TEXT: the output ends before it",
}

EXPORT = {  # llama.cpp's convert_hf_to_gguf.py
    ("--outtype",): "use --dtype (bf16, f16, f32, or q8_0 for llama.cpp): the type the weights are written in",
    ("--outfile",): "use -o: the .gguf file, or a directory for it",
}


class _Refused(argparse.Action):
    """A flag taken only to be refused with why: registered, so that argparse matches it whole (`-ngl`
    is not `-n gl`) wherever it stands, with its value or without."""

    def __init__(self, option_strings, dest, why: str = "", **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not taken here: {self.why}")


def add_refusals(parser: argparse.ArgumentParser, table: dict) -> None:
    """Registers `table`'s flags on `parser`, hidden from its help, each refused with its reason."""
    for flags, why in table.items():
        parser.add_argument(*flags, action=_Refused, why=why)
