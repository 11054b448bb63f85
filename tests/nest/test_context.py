"""Without a MaxSeq, a cache row holds the model's own context, as vLLM's --max-model-len and
llama.cpp's -c 0 default to it (vLLM: the config's max_position_embeddings, 2048 where a config states
none; llama.cpp: the GGUF's context_length), cut to what memory holds (`nest.context`)."""

from __future__ import annotations

import importlib
import json
import re
import shutil
from pathlib import Path

import pytest

from linnet import nest
from linnet.cli import build_parser, main
from linnet.errors import LinnetError
from linnet.ir.specialize import specialize
from linnet.nest import memory
from linnet.nest.context import CACHE_SHARE, GRANULE, choose_max_seq, cpu_cache_space
from linnet.nest.errors import DeviceError
from linnet.nest.load import resolve_card

load_module = importlib.import_module("linnet.nest.load")  # (`nest.load` is the function)

TINY = "tiny-llama"
TINY_FILE = Path(__file__).parents[2] / "linnet" / "nest" / "cards" / "tiny-llama.linnet"


def test_a_checkpoint_holds_its_configs_max_position_embeddings(tiny_hf):
    _, path = tiny_hf
    config = json.loads((path / "config.json").read_text())
    model = nest.load(path, generics={"Batch": 2}, tokenizer=False)
    assert model.max_seq == config["max_position_embeddings"] == 128  # vLLM's max_model_len for this config
    assert model.info["context"].free is None  # nothing cut


def test_a_gguf_holds_its_context_length(tiny_hf, to_gguf, tmp_path):
    gguf = pytest.importorskip("gguf")
    hf_model, _ = tiny_hf
    path = tmp_path / "tiny.gguf"
    to_gguf(hf_model, path)
    field = gguf.GGUFReader(path).fields["llama.context_length"]
    trained = int(field.parts[field.data[0]][0])  # llama.cpp's n_ctx_train, what its -c 0 takes
    assert nest.load(str(path), generics={"Batch": 2}, tokenizer=False).max_seq == trained


def test_a_model_that_states_no_context_holds_vllms_2048():
    # vLLM: "The model's config.json does not contain any of the following keys ... Assuming the model's
    # maximum length is 2048"; tiny-llama's card has no meta max_context
    model = nest.load(TINY, weights="random", tokenizer=False, generics={"Batch": 1})
    assert model.max_seq == 2048


def test_a_long_context_is_cut_to_what_half_the_memory_left_holds(tmp_path, monkeypatch):
    """A card of a 1M-token context on a host with 40 MB free: rows of the most whole granules whose
    cache, as the loaded model holds it, fits in half of what the weights leave; one granule more would not."""
    card = tmp_path / "long.linnet"
    card.write_text(open(TINY_FILE).read() + "\nmeta {\n  max_context = 1048576\n}\n")
    free = 40_000_000
    monkeypatch.setattr(memory, "free_cpu_bytes", lambda: free)
    model = nest.load(card, weights="random", tokenizer=False, generics={"Batch": 4})  # exact: params as declared
    runner = model.runner
    cache = sum(t.numel() * t.element_size() for t in (getattr(runner, n) for n in runner.state))
    held = {t.untyped_storage().data_ptr(): t.numel() * t.element_size() for name in runner.params
            for t in _tensors(getattr(runner, name))}  # (a tied weight once)
    weights = sum(held.values())
    context = model.info["context"]
    assert context.model == 1048576 and context.free == free and model.max_seq % GRANULE == 0
    room = (free - weights) * CACHE_SHARE
    assert cache <= room < cache / model.max_seq * (model.max_seq + GRANULE)
    assert "cut to what the cache's rows fit" in context.note("--max-seq")


def test_a_context_cut_to_memory_is_specialized_once(tmp_path, monkeypatch):
    """Without a MaxSeq the card is weighed by its sizes alone (`specialize.bind`) and specialized, its
    checks run, once: at the MaxSeq chosen (it was specialized at its 1M positions first, then again)."""
    card = tmp_path / "long.linnet"
    card.write_text(open(TINY_FILE).read() + "\nmeta {\n  max_context = 1048576\n}\n")
    monkeypatch.setattr(memory, "free_cpu_bytes", lambda: 40_000_000)
    asked, real = [], load_module.specialize

    def counted(module, generics, numerics):
        asked.append(generics["MaxSeq"])
        return real(module, generics, numerics)
    monkeypatch.setattr(load_module, "specialize", counted)
    model = nest.load(card, weights="random", tokenizer=False, generics={"Batch": 4})
    assert asked == [model.max_seq] and model.max_seq < 1048576


@pytest.mark.parametrize("card_line, bad, error", [
    ("kv_heads = 2", "kv_heads = 0", "zero.linnet:10:14: error: `kv_heads` is a size and must be positive, not 0"),
    ("heads = 4", "heads = 0", "llama.linnet:17:19: error: cannot evaluate 64 / 0")])
def test_a_bad_size_is_the_cards_error_before_any_weighing(tmp_path, card_line, bad, error):
    # a cache of no kv heads weighs nothing, and heads = 0 divides head_dim by zero: the card's error, at
    # its value (a size set out of range) or at the line of its architecture that the size breaks (the
    # division), whether a MaxSeq is named or chosen
    card = tmp_path / "zero.linnet"
    card.write_text(open(TINY_FILE).read().replace(card_line, bad))
    rendered = []
    for generics in ({"Batch": 1}, {"Batch": 1, "MaxSeq": 64}):
        with pytest.raises(LinnetError) as caught:
            nest.load(card, weights="random", tokenizer=False, generics=generics)
        rendered.append(caught.value.render())
    assert error in rendered[0] and rendered[0] == rendered[1]


def test_llama_3_1_8b_on_24_gib_gets_no_128k_rows():
    """Llama 3.1 8B's 131072 positions in 8 bf16 rows would be 137 GB of cache: on a 24 GiB host it gets
    what half the memory its 8,030,261,248 bf16 weights leave holds, at 2 (k, v) x 32 layers x 8 kv heads
    x 128 dims x 2 bytes a position a row (its config.json's sizes)."""
    free = 24 << 30
    spec = specialize(resolve_card("llama-3.1-8b-instruct", None)[0], {"Batch": 8, "MaxSeq": 131072, "T": "bf16"},
                      "fast")
    context = choose_max_seq(spec, free)
    per_position = 8 * 2 * 32 * 8 * 128 * 2
    want = int((free - 8_030_261_248 * 2) * CACHE_SHARE // per_position) // GRANULE * GRANULE
    assert (context.model, context.max_seq) == (131072, want) and 2048 < want < 8192


@pytest.mark.parametrize("batch, want", [(8, 16384), (1, 131072)])
def test_llama_3_2_1b_on_a_cpu_gets_the_4_gib_of_vllms_cpu_cache(batch, want):
    """vLLM's CPU backend gives the cache VLLM_CPU_KVCACHE_SPACE GiB, 4 where it is unset ("Environment
    variable VLLM_CPU_KVCACHE_SPACE (GiB) for CPU backend is not set, using 4 by default"): Llama 3.2 1B's
    bf16 positions take 2 (k, v) x 16 layers x 8 kv heads x 64 dims x 2 bytes (its config.json's sizes), so
    8 rows hold 16384 each, where half of 24 GiB free gave them 44288 (11.6 GB); one row holds the whole
    131072 of its context, the 4 GiB llama.cpp's -c 0 allocates for it in f16."""
    spec = specialize(resolve_card("llama-3.2-1b-instruct", None)[0], {"Batch": batch, "MaxSeq": 131072, "T": "bf16"},
                      "fast")
    per_position = batch * 2 * 16 * 8 * 64 * 2
    assert (4 << 30) // per_position == want
    by_memory = choose_max_seq(spec, 24 << 30)
    context = choose_max_seq(spec, 24 << 30, space=4 << 30)
    assert (context.model, context.max_seq) == (131072, want)
    if batch == 8:
        assert by_memory.max_seq == 44288 and by_memory.space is None
        assert context.space == 4 << 30 and "cut to what the cache's rows fit in 4 GiB" in context.note("--max-seq")
    else:  # nothing cut
        assert by_memory.max_seq == 131072 and context.space is None and context.free is None


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_long_context_on_a_cpu_is_cut_to_vllm_cpu_kvcache_space(tmp_path, monkeypatch, backend):
    """A tiny random model whose card states a 1M-token context, on a host with far more free than the
    cache may take: the rows hold the most whole granules whose cache, as the loaded model holds it, fits
    in VLLM_CPU_KVCACHE_SPACE=1 GiB, one granule more would not; the note says so."""
    card = tmp_path / "long.linnet"
    card.write_text(open(TINY_FILE).read() + "\nmeta {\n  max_context = 1048576\n}\n")
    monkeypatch.setattr(memory, "free_cpu_bytes", lambda: 1 << 40)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    model = nest.load(card, backend=backend, weights="random", tokenizer=False, generics={"Batch": 8})
    runner = model.runner
    if backend == "torch":
        cache = sum(t.numel() * t.element_size() for t in (getattr(runner, n) for n in runner.state))
    else:
        cache = sum(a.nbytes for a in runner.state_bits.values())
    assert cache <= 1 << 30 < cache / model.max_seq * (model.max_seq + GRANULE)
    assert model.max_seq % GRANULE == 0 and model.info["context"].space == 1 << 30
    assert "fit in 1 GiB, the cache vLLM's CPU backend reserves (VLLM_CPU_KVCACHE_SPACE" in \
        model.info["context"].note("--max-seq")


@pytest.mark.parametrize("value", ["four", "-1", "1.5"])
def test_a_vllm_cpu_kvcache_space_that_is_no_whole_number_is_an_error_naming_it(value, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", value)
    with pytest.raises(DeviceError, match=f"VLLM_CPU_KVCACHE_SPACE='{re.escape(value)}': .* a whole number"):
        nest.load(TINY, weights="random", tokenizer=False, generics={"Batch": 1})
    # read only where a MaxSeq is chosen: one named loads as ever
    assert nest.load(TINY, weights="random", tokenizer=False, generics={"Batch": 1, "MaxSeq": 64}).max_seq == 64


def test_unset_or_0_is_vllms_4_gib(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert cpu_cache_space() == 4 << 30
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0")
    assert cpu_cache_space() == 4 << 30
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "40")
    assert cpu_cache_space() == 40 << 30


def test_a_cache_longer_than_a_learned_table_stays_an_error(tmp_path):
    shutil.copy(Path(__file__).parents[1] / "compiler" / "from_the_doc" / "gpt2.linnet", tmp_path / "gpt2.linnet")
    card = tmp_path / "card.linnet"
    card.write_text('card "tiny-gpt2"\nimport gpt2\n')
    assert nest.load(card, weights="random", tokenizer=False, generics={"Batch": 1}).max_seq == 64  # its max_pos
    with pytest.raises(LinnetError, match="bind MaxSeq to at most 64"):
        nest.load(card, weights="random", tokenizer=False, generics={"Batch": 1, "MaxSeq": 65})


def test_the_command_line_notes_what_it_chose(capsys, gguf_path):
    gguf = pytest.importorskip("gguf")
    field = gguf.GGUFReader(gguf_path).fields["llama.context_length"]
    trained = int(field.parts[field.data[0]][0])
    base = ["generate", "smollm2-135m-instruct", "hi", "--weights", "random", "--tokenizer", str(gguf_path), "-n", "1"]
    assert main(base) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("linnet: note: --max-seq")]
    assert notes == [f"linnet: note: --max-seq {trained}: the model's context (its meta max_context); "
                     f"--max-seq sets another"]
    assert main(base + ["--max-seq", "64"]) == 0
    assert "linnet: note: --max-seq" not in capsys.readouterr().err


def test_auto_and_llama_cpps_0_ask_for_the_models_context():
    parse = build_parser().parse_args
    assert parse(["serve", "card", "--max-model-len", "auto"]).max_seq is None
    assert parse(["serve", "card"]).max_seq is None
    assert parse(["generate", "card", "hi", "-c", "0"]).max_seq is None
    assert parse(["generate", "card", "hi", "--ctx-size", "auto"]).max_seq is None
    assert parse(["generate", "card", "hi", "-c", "100"]).max_seq == 100


def _tensors(value) -> list:
    return [t for v in value for t in _tensors(v)] if isinstance(value, list) else [value]


LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0}


@pytest.mark.parametrize("arch, max_positions, scaling, want", [
    # Qwen's documentation: YaRN of factor 4 over 32768 positions handles up to 131,072 tokens
    ("Qwen2ForCausalLM", 32768, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 131072),
    # vLLM multiplies max_position_embeddings by a linear factor
    ("LlamaForCausalLM", 4096, {"rope_type": "linear", "factor": 2.0}, 8192),
    # Llama 3.1's config states its scaled length itself
    ("LlamaForCausalLM", 131072, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 131072),
    ("LlamaForCausalLM", 2048, None, 2048)])
def test_a_configs_context_is_vllms_with_its_rope_scaling(arch, max_positions, scaling, want):
    from linnet.export.hf_config import context_length
    from linnet.frontend import load_source
    from linnet.nest.autocard import card_source_from_config, trained_context

    config = {**LLAMA_CONFIG, "architectures": [arch], "max_position_embeddings": max_positions,
              **({"rope_scaling": scaling} if scaling else {})}
    module = load_source(card_source_from_config(config, "tiny"), "<tiny>")
    assert module.meta["max_context"] == want
    # a GGUF's context_length is llama.cpp's n_ctx_train as it stands, whatever its rope scaling
    assert load_source(card_source_from_config(config, "tiny", rope_scaled_context=False),
                       "<tiny>").meta["max_context"] == max_positions
    # and vLLM reads the same length from an export's config.json
    exported = {**config, "max_position_embeddings": context_length(specialize(module), config=True)}
    assert trained_context(exported) == want
