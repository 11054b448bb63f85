"""A bf16 request served beside others gives bitwise what it gives alone, as a llama.cpp user
expects of one prompt (vLLM's batch-invariant mode): 16 greedy requests through the Engine
together, then each through the same engine by itself, tokens and logprobs compared exactly.
Alone, its prompt is a pass of its own (one or two rows for the shortest prompts) and its head
scores one row; together, prompts share passes with decoding rows, so each linear, norm and
attention call has other row counts. The model is a Llama wider than tiny-llama (K of 1024 and
2048, a 4096-token head, random weights): a row's sums then differ often enough in their last
f32 bits, where its call's other rows change them, to round to another bf16 (before the linear
kernel summed one or two rows as AMX does more, 10 of these 16 requests' logprobs differed)."""

import pytest
import torch

from linnet import nest
from linnet.kernels import cpu_linear
from linnet.serve import Engine, Request
from tests.serve.test_engine import prompts

pytestmark = pytest.mark.skipif(cpu_linear.library() is None, reason="Linnet's CPU kernels do not run here")


WIDE_LLAMA = """card "wide-llama"
import llama

config {
  vocab = 4096
  dim = 1024
  layers = 2
  heads = 8
  kv_heads = 4
  ffn = 2048
  norm_eps = 1e-5
  rope_theta = 10000.0
}
"""


# torch-replayed: the decode step captured and replayed as one call of the kernels, as `linnet serve` runs it
@pytest.mark.parametrize("backend", ["torch", "torch-replayed", "jax"])
def test_16_greedy_bf16_requests_together_give_what_each_gives_alone(backend, tmp_path):
    card = tmp_path / "wide-llama.linnet"
    card.write_text(WIDE_LLAMA)
    model = nest.load(card, backend=backend.removesuffix("-replayed"), compile=backend.endswith("-replayed"),
                      weights="random", seed=1, numerics="fast", tokenizer=False,
                      generics={"Batch": 16, "MaxSeq": 64, "T": "bf16"})
    ps = prompts(16, 1, 30, seed=5)
    engine = Engine(model, token_budget=64)
    engine.warmup((len(p) for p in ps), logprobs=True)

    def ask(p):
        return Request(prompt=p, max_new_tokens=10, logprobs=3)

    def outcome(c):
        return c.tokens, [(lp.token, lp.logprob, lp.top) for lp in c.logprobs]

    together, stats = engine.run([ask(p) for p in ps])
    assert stats.passes["mixed"] > 0  # prompts joined passes while others decoded
    alone = [outcome(engine.run([ask(p)])[0][0]) for p in ps]
    assert [outcome(c) for c in together] == alone
    # two copies of one prompt (a request's n=2): the second shares the first's cache and computes
    # only its last prompt token, in a pass of a row or two
    for p, want in list(zip(ps, alone))[:4]:
        copies, _ = engine.run([ask(p), ask(p)])
        assert [outcome(c) for c in copies] == [want, want]


def test_16_greedy_requests_on_a_ggufs_blocks_together_give_what_each_gives_alone(tmp_path):
    """quantization='gguf': the linears run in the file's Q4_1 blocks (`cpu_qlinear`), whose calls of
    more than a tile of rows decode each panel once, of fewer in registers; a request's tokens and
    logprobs are the same bits beside others as alone."""
    gguf = pytest.importorskip("gguf")
    from tests.nest.test_load_gguf import write_typed_llama

    path = write_typed_llama(tmp_path / "tiny-q4_1.gguf", gguf.GGMLQuantizationType.Q4_1)
    model = nest.load(path, backend="torch", device="cpu", numerics="fast", tokenizer=False, quantization="gguf",
                      generics={"Batch": 16, "MaxSeq": 64, "T": "bf16"})
    ps = prompts(16, 1, 30, seed=5, vocab=model.vocab)
    engine = Engine(model, token_budget=64)

    def outcome(c):
        return c.tokens, [(lp.token, lp.logprob, lp.top) for lp in c.logprobs]

    def ask(p):
        return Request(prompt=p, max_new_tokens=10, logprobs=3)

    together, stats = engine.run([ask(p) for p in ps])
    assert stats.passes["mixed"] > 0  # prompts joined passes while others decoded
    assert [outcome(c) for c in together] == [outcome(engine.run([ask(p)])[0][0]) for p in ps]


# Every family's ops outside Linnet's kernels too: embedding rows, residual adds, QK norms, MoE routing
# (router, top-k, softmax, the experts' matmuls and their weighted sum), attention sinks, the head, and the
# sampler's softmax, filters, penalties, logprobs and prompt scores, Gemma 2's capped attention scores, and
# Phi-2's LayerNorms (torch's kernel) and partial rotary, GPT-2's learned positions
FAMILIES = ["tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-mixtral", "tiny-gpt-oss", "tiny-phi3", "tiny-olmo2",
            "tiny-granite", "tiny-smollm3", "tiny-gemma2", "tiny-deepseek-v2", "tiny-deepseek-v3", "tiny-phi2",
            "tiny-gpt2"]


def mixed_request(prompt, i: int) -> Request:
    """Greedy, seeded top-p / top-k, or seeded min-p with penalties, by i; 5 alternatives a token, and
    every other request its prompt's scores."""
    kind = [dict(),
            dict(temperature=0.9, top_p=0.8, top_k=20, seed=100 + i),
            dict(temperature=1.3, min_p=0.05, seed=7 + i, repetition_penalty=1.2, presence_penalty=0.3,
                 frequency_penalty=0.2)][i % 3]
    return Request(prompt=prompt, max_new_tokens=5, logprobs=5, prompt_logprobs=5 if i % 2 == 0 else None, **kind)


def everything(c):
    return (c.tokens, [(lp.token, lp.logprob, lp.top) for lp in c.logprobs],
            [None if lp is None else (lp.token, lp.logprob, lp.top) for lp in c.prompt_logprobs or []])


# JAX compiles each pass's shapes (about 10 s a case here): bf16 for a dense and a MoE family, whose CPU
# activations are f32 as f32's are (`gather_rows`), the weights and cache bf16
# JAX: the families whose passes take paths of their own there (a window, sinks, a MoE sum, fused
# projections, capped scores); qwen3, olmo2 and granite differ from llama only in where norms and scales
# sit, smollm3 in the layers it does not rotate
JAX_FAMILIES = ["tiny-llama", "tiny-gemma3", "tiny-mixtral", "tiny-gpt-oss", "tiny-phi3", "tiny-gemma2"]
CASES = [(card, "torch", dtype) for card in FAMILIES for dtype in ("f32", "bf16")] + \
    [(card, "jax", "f32") for card in JAX_FAMILIES] + [("tiny-llama", "jax", "bf16"), ("tiny-mixtral", "jax", "bf16")]


@pytest.mark.parametrize("card, backend, dtype", CASES)
def test_every_family_serves_a_request_alike_alone_beside_others_and_as_copies(card, backend, dtype):
    """16 requests through 4 rows (prompts chunked into passes beside decoding rows), the first 3
    together (their prompts packed in one pass, then decoded together), and each alone: tokens,
    logprobs, alternatives and prompt scores bit for bit the same; and two copies of one request."""
    model = nest.load(card, backend=backend, weights="random", seed=3, numerics="fast", tokenizer=False,
                      generics={"Batch": 4, "MaxSeq": 48, "T": dtype})
    ps = prompts(16, 1, 20, seed=9, vocab=model.vocab)
    engine = Engine(model, token_budget=32)
    alone = [everything(engine.run([mixed_request(p, i)])[0][0]) for i, p in enumerate(ps)]
    together, stats = engine.run([mixed_request(p, i) for i, p in enumerate(ps)])
    assert stats.passes["mixed"] > 0  # prompts joined passes while others decoded
    assert [everything(c) for c in together] == alone
    three, stats = engine.run([mixed_request(p, i) for i, p in enumerate(ps[:3])])
    assert [everything(c) for c in three] == alone[:3]
    copies, _ = engine.run([mixed_request(ps[1], 1), mixed_request(ps[1], 1)])
    assert [everything(c) for c in copies] == [alone[1], alone[1]]


def test_long_prompts_on_a_many_core_cpu_serve_alike_alone_and_beside_others():
    """Spans past 512 positions, which the attention kernel computes in parts, with the kernels on 20
    threads (a server's CPU: the 2 of a CI machine oversubscribed): a decode step's few KV heads
    (4 rows of 2) then fall short of twice the threads where a pass with prompt tokens beside them
    does not. The parts once followed from that count, and 7 of these 8 f32 requests differed."""
    model = nest.load("tiny-llama", backend="torch", weights="random", seed=1, numerics="fast", tokenizer=False,
                      generics={"Batch": 4, "MaxSeq": 1024, "T": "f32"})
    ps = prompts(8, 520, 900, seed=5, vocab=model.vocab)
    engine = Engine(model, token_budget=256)
    before = torch.get_num_threads()
    torch.set_num_threads(20)
    try:
        alone = [everything(engine.run([mixed_request(p, i)])[0][0]) for i, p in enumerate(ps)]
        together, stats = engine.run([mixed_request(p, i) for i, p in enumerate(ps)])
    finally:
        torch.set_num_threads(before)
    assert stats.passes["mixed"] > 0
    assert [everything(c) for c in together] == alone
