"""Compiles a card to PyTorch and JAX source, imports both, and checks they agree.

    python examples/01-compile/compile.py [--card tiny-llama] [--out /tmp/linnet-out]

The generated files are ordinary Python: open them to read the model.
"""

import argparse
import importlib.util
from pathlib import Path

import numpy as np

from linnet import nest
from linnet.compiler import generate
from linnet.ir.specialize import specialize

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--card", default="tiny-llama", help="a card's name (see `linnet cards`; default: tiny-llama)")
parser.add_argument("--out", default="/tmp/linnet-out", help="the folder the two modules are written in "
                    "(default: /tmp/linnet-out)")
args = parser.parse_args()

from linnet.nest.random_weights import random_weights  # (after the flags: it imports torch, seconds --help need not wait)

generics = {"Batch": 2, "MaxSeq": 64, "T": "f32"}
try:
    module = nest.card(args.card).module()
except nest.CardError as err:
    parser.exit(1, f"{parser.prog}: error: {err}\n")
out = Path(args.out)
try:
    out.mkdir(parents=True, exist_ok=True)
except OSError as err:  # a file there, or a folder that cannot be made
    parser.exit(1, f"{parser.prog}: error: --out {out}: {err.strerror or err}\n")
weights = random_weights(specialize(module, generics), seed=0)

logits = {}
for backend in ("torch", "jax"):
    path = out / f"{args.card.replace('-', '_')}_{backend}.py"
    path.write_text(generate(module, backend, generics))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.Model(weights)
    prompt = np.array([5, 9, 11, 3], np.int32)
    logits[backend] = np.asarray(model.prefill(prompt, np.arange(4, dtype=np.int32), np.zeros(4, np.int32),
                                               np.array([3], np.int32)))
    print(f"wrote {path} ({len(path.read_text().splitlines())} lines)")

diff = np.abs(logits["torch"] - logits["jax"]).max() / np.abs(logits["torch"]).max()
print(f"torch and JAX agree on the next-token logits: max relative difference {diff:.2e}")
