"""Tensor parallelism under JAX: `codegen_common.shard_plan` reads Megatron's split off the IR, and a
model spread over several devices (`nest.load(..., shards=N)`) computes what one device does.

Several CPU devices exist only if XLA is told before JAX starts, so the mesh runs in a subprocess
with XLA_FLAGS=--xla_force_host_platform_device_count=4."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from linnet.codegen_common import fused_outputs, shard_plan
from linnet.compiler import check_file
from linnet.ir.passes import inline_calls
from linnet.ir.specialize import specialize


def plan(kit, card):
    return shard_plan(inline_calls(specialize(check_file(kit.CARDS / f"{card}.linnet"), {"Batch": 2, "MaxSeq": 16}, "exact")))


def test_the_plan_is_megatrons(kit):
    params, states = plan(kit, "tiny-llama")
    # stacked [layers, out, in]: q, k, v, gate and up split their rows (axis 1), o and down their columns
    assert {n: params[n] for n in ("wq", "wk", "wv", "w_gate", "w_up")} == dict.fromkeys(("wq", "wk", "wv", "w_gate", "w_up"), 1)
    assert params["wo"] == 2 and params["w_down"] == 2
    assert params["lm_head"] == 0  # the vocabulary
    assert "embed" not in params and "attn_norm" not in params
    assert states == {"k_cache": 3, "v_cache": 3}  # [layers, Batch, MaxSeq, kv_heads, head_dim]


def test_per_head_norms_and_q_biases_follow_their_heads(kit):
    params, _ = plan(kit, "tiny-qwen3")
    assert "q_norm" not in params and "k_norm" not in params  # over head_dim: every shard holds whole heads
    params, _ = plan(kit, "tiny-qwen2")
    assert params["bq"] == params["bk"] == params["bv"] == 1


def test_the_newer_families_plans(kit):
    # OLMo's q/k norms span every head: they stay whole (XLA sums the split rows' squares across the mesh);
    # Phi-3's fused q/k/v and gate/up split their rows as one weight each
    params, _ = plan(kit, "tiny-olmo2")
    assert params["wq"] == params["wk"] == 1 and "q_norm" not in params and "attn_out_norm" not in params
    params, _ = plan(kit, "tiny-phi3")
    assert params["wqkv"] == params["w_gate_up"] == 1 and params["wo"] == params["w_down"] == 2


def test_granites_plan_is_llamas_and_mixtrals_experts_split_among_the_devices(kit):
    # (neither runs over the mesh below: granite's multipliers split nothing, mixtral's experts split as gpt-oss's)
    assert plan(kit, "tiny-granite") == plan(kit, "tiny-llama")
    params, _ = plan(kit, "tiny-mixtral")
    # [layers, experts, ...]: each device holds whole experts, and the router's scores of its own
    assert params["w_gate"] == params["w_up"] == params["w_down"] == params["router"] == 1


def test_the_plan_splits_experts_and_column_biases(kit):
    params, _ = plan(kit, "tiny-gpt-oss")
    assert params["bq"] == 1 and params["wo"] == 2 and "bo" not in params  # a row-parallel bias is added once
    assert params["w_gate_up"] == 1 and params["w_down"] == 1 and params["b_down"] == 1  # [layers, experts, ...]


SCRIPT = textwrap.dedent("""
    import collections, json, random, re
    import jax
    import numpy as np
    from linnet import nest
    from linnet.serve import Engine, Request

    def collectives(runner, entry, args):
        # {"kind f32[shape]": count}: the collectives in the HLO XLA compiled for the entry
        with jax.default_matmul_precision("default"):
            text = runner.compiled[entry].lower(runner.weights, runner.state_bits,
                                                *runner._arguments(args)).compile().as_text()
        kinds = "all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter"
        found = (re.search(r"= (\\w+\\[[\\d,]*\\])\\S* (" + kinds + r")(-start)?\\(", line) for line in text.splitlines())
        return dict(collections.Counter(f"{m.group(2)} {m.group(1)}" for m in found if m))

    out = {}
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 128) for _ in range(rng.randint(4, 14))] for _ in range(5)]
    for card, counts in (("tiny-llama", (None, 2, 4)), ("tiny-gpt-oss", (None, 2)), ("tiny-olmo2", (None, 2)),
                         ("tiny-phi3", (None, 2))):
        for shards in counts:
            model = nest.load(card, backend="jax", weights="random", seed=2, generics={"Batch": 4, "MaxSeq": 32},
                              numerics="fast", shards=shards)
            engine = Engine(model, token_budget=32)
            engine.warmup(len(p) for p in prompts)
            done, stats = engine.run([Request(prompt=p, max_new_tokens=6) for p in prompts])
            n = len(prompts[0])
            model.reset()
            logits = np.asarray(model.prefill(np.array(prompts[0], np.int32), np.arange(n, dtype=np.int32),
                                              np.zeros(n, np.int32), np.array([n - 1], np.int32)))
            out[f"{card}/{shards}"] = dict(tokens=[c.tokens for c in done], compiles=stats.compiles,
                                           logits=logits[0].tolist())
            if shards:  # (on one device, fast numerics fuse q, k and v into one weight; Phi-3's is one)
                wq = model.runner.weights["wq" if "wq" in model.runner.weights else "wqkv"][0]
                out[f"{card}/{shards}"].update(
                    wq_devices=len(wq.devices()), wq_rows=wq.shape[0], wq_shard=list(wq.addressable_shards[0].data.shape),
                    cache_spec=str(model.runner.state_bits["k_cache"].sharding.spec))
            if shards == 2 and card in ("tiny-llama", "tiny-phi3"):
                z = lambda n: np.zeros(n, np.int32)
                out[f"{card}/{shards}"].update(decode_collectives=collectives(model.runner, "decode", (z(4), z(4))),
                                               prefill_collectives=collectives(model.runner, "prefill",
                                                                               (z(32), z(32), z(32), z(4))))
    # no MaxSeq: a 1M-token card's rows are cut to what the host's 40 MB hold, spread or not (a CPU's
    # devices share the host's memory: not counted once a device)
    import pathlib, tempfile
    from linnet.nest import memory
    memory.free_cpu_bytes = lambda: 40_000_000
    long = pathlib.Path(tempfile.mkdtemp()) / "long.linnet"
    long.write_text((pathlib.Path(nest.__file__).parent / "cards" / "tiny-llama.linnet").read_text()
                    + "\\nmeta {\\n  max_context = 1048576\\n}\\n")
    for shards in (None, 2):
        model = nest.load(long, backend="jax", weights="random", generics={"Batch": 4}, numerics="fast", shards=shards)
        out[f"long/{shards}"] = model.max_seq
    for name, shards in (("too_many", 5), ("none", 0)):
        try:
            nest.load("tiny-llama", backend="jax", weights="random", shards=shards)
        except ValueError as err:
            out[name] = str(err)
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


# A family a way of splitting: gpt-oss's experts, q/k/v biases and sinks; olmo2's norms over whole projections
# (summed across the mesh); phi3's fused projections. The others split as one of these, and the plans above
# check them: qwen2's biases are gpt-oss's, qwen3's per-head norms stay whole on each device, granite's
# multipliers split nothing, mixtral's experts are gpt-oss's without biases, and gemma2's capped scores and
# sliding window act within a device's heads. (Each family took 6-15 s of the subprocess's 50-70.)
@pytest.mark.parametrize("card, shards", [("tiny-llama", 2), ("tiny-llama", 4), ("tiny-gpt-oss", 2),
                                         ("tiny-olmo2", 2), ("tiny-phi3", 2)])
def test_a_model_over_several_devices_computes_what_one_does(results, card, shards):
    import numpy as np

    one, many = results[f"{card}/None"], results[f"{card}/{shards}"]
    assert many["tokens"] == one["tokens"]
    a, b = np.array(one["logits"]), np.array(many["logits"])
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert many["compiles"] == 0  # the mesh adds no compile after warmup
    assert many["wq_devices"] == shards and many["wq_shard"][0] == many["wq_rows"] // shards  # q's rows are split
    # the caches split over kv heads where the mesh divides them (2 kv heads), else stay whole
    assert many["cache_spec"] == ("P(None, None, None, 'model')" if shards == 2 else "P()")


def test_phi3s_fused_projections_are_read_as_their_parts(kit):
    """Phi-3's fused weights' parts, as its code slices their products: q, k and v (4 heads, 2 kv
    heads of 16), gate and up (96 each). Read so, each part splits on its own and its slices stay
    split, so down is row parallel as Llama's is (above)."""
    module = inline_calls(specialize(check_file(kit.CARDS / "tiny-phi3.linnet"), {"Batch": 2, "MaxSeq": 16}, "exact"))
    assert fused_outputs(module) == {"wqkv": ((0, 64), (64, 96), (96, 128)), "w_gate_up": ((0, 96), (96, 192))}
    for card in ("tiny-llama", "tiny-qwen2", "tiny-gpt-oss"):  # separate weights, or a bias: none
        assert fused_outputs(inline_calls(specialize(check_file(kit.CARDS / f"{card}.linnet"),
                                                     {"Batch": 2, "MaxSeq": 16}, "exact"))) == {}


def test_device_major_rows_give_each_device_its_share_of_every_part():
    """The rows of a fused weight as a mesh holds them, against a plain-numpy statement: device d's
    block is its 1 / shards of each part; the product read through a part's slice is that part's."""
    import numpy as np

    from linnet.codegen_jax.runtime import DeviceMajorProduct, device_major_order

    parts, shards = ((0, 8), (8, 12), (12, 16)), 2
    order = device_major_order(parts, shards)
    assert order.tolist() == [0, 1, 2, 3, 8, 9, 12, 13, 4, 5, 6, 7, 10, 11, 14, 15]
    rng = np.random.default_rng(0)
    w, x = rng.normal(size=(16, 5)), rng.normal(size=(3, 5))
    product = DeviceMajorProduct(x @ w[order].T, parts, shards)
    for start, stop in parts:
        np.testing.assert_allclose(product[:, start:stop], x @ w[start:stop].T, rtol=1e-12)
    with pytest.raises(ValueError, match=r"read by its parts .* not \(4, 12\)"):
        product[:, 4:12]
    # widened to f32 (`linear(h, wqkv) as f32` in bf16): the product's f32 sums, read by part as before
    import jax.numpy as jnp

    from linnet.codegen_jax.runtime import DeviceMajorRows, linear

    x16, w16 = x.astype(jnp.bfloat16), w[order].astype(jnp.bfloat16)
    widened = linear(x16, DeviceMajorRows(w16, parts, shards), out_dtype=jnp.float32)
    assert isinstance(widened, DeviceMajorProduct) and widened.y.dtype == jnp.float32
    exact = x16.astype(np.float64) @ w16.astype(np.float64).T
    np.testing.assert_allclose(widened.y, exact, rtol=1e-6, atol=1e-6)


def test_phi3_over_two_devices_moves_what_llama_does(results):
    """In the HLO XLA compiles for Phi-3 over two devices, the collectives are Megatron's, as for
    Llama's separate weights: one all-reduce of the rows' features after o and one after down a
    layer (2 layers), and the logits gathered from the vocabulary's split; no all-gather or
    permute of a fused projection's output, in the decode step and in a 32-token pass."""
    phi3, llama = results["tiny-phi3/2"], results["tiny-llama/2"]
    assert phi3["decode_collectives"] == {"all-reduce f32[4,64]": 4, "all-gather f32[4,128]": 1}
    assert phi3["prefill_collectives"] == {"all-reduce f32[32,64]": 4, "all-gather f32[4,128]": 1}
    assert llama["decode_collectives"] == phi3["decode_collectives"]
    assert llama["prefill_collectives"] == phi3["prefill_collectives"]


def test_a_model_over_several_devices_cuts_its_context_to_the_hosts_memory(results):
    assert 0 < results["long/2"] == results["long/None"] < 1048576


def test_more_shards_than_devices_is_a_clear_error(results):
    assert "shards=5, but there are 4 cpu devices" in results["too_many"]
    assert results["none"] == "shards=0: a model is spread over 1 device or more"  # (not the devices' count)


def test_torch_takes_no_shards():
    from linnet import nest

    with pytest.raises(ValueError, match="torch backend runs on one"):
        nest.load("tiny-llama", backend="torch", weights="random", shards=2)


def test_linnet_serve_says_what_is_wrong_with_shards(capsys):
    from linnet.cli import main

    with pytest.raises(SystemExit) as usage:  # flags that do not go together: argparse's usage error
        main(["serve", "tiny-llama", "--weights", "random", "--shards", "2"])
    assert usage.value.code == 2 and "pass --backend jax" in capsys.readouterr().err
    assert main(["serve", "tiny-llama", "--weights", "random", "--backend", "jax", "--shards", "64"]) == 1
    assert "--shards 64, but there " in capsys.readouterr().err
