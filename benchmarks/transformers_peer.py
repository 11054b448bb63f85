"""transformers' batched `generate` on throughput.py's load: the peer for the GPU check's ratio.

Random Llama 3.1 8B weights in bf16 on the GPU, the same prompts (random.Random(0)),
64 at a time, left-padded, 128 new tokens each, no end token.
"""

import argparse
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench_args import count  # this folder's
from cuda_needed import require_cuda  # this folder's

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--requests", type=count, default=256, help="requests in the load (256)")
parser.add_argument("--rows", type=count, default=64, help="requests generated together (64)")
parser.add_argument("--new", type=count, default=128, help="tokens each request generates (128)")
args = parser.parse_args()
require_cuda("transformers_peer.py", cpu_flag=None)

rng = random.Random(0)
prompts = [[rng.randrange(100, 20000) for _ in range(rng.randint(128, 512))] for _ in range(args.requests)]
cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0,
                  max_position_embeddings=8192, torch_dtype=torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
start = time.perf_counter()
generated = 0
for i in range(0, len(prompts), args.rows):
    group = prompts[i:i + args.rows]
    width = max(len(p) for p in group)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in group], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device="cuda")
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                             do_sample=False, pad_token_id=0)
    generated += (out.shape[1] - width) * len(group)
seconds = time.perf_counter() - start
print(f"{generated} tokens in {seconds:.2f} s: {generated / seconds:.0f} tokens/s")
