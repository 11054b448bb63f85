"""Safetensors weights: a random tiny Llama written by transformers' save_pretrained (>= 3 shards and
an index) loads through nest.load, from its directory and from a fake Hugging Face cache, and gives
transformers' logits on both backends."""

import json
import os
import shutil
from pathlib import Path

import pytest

from linnet import nest

PROMPTS = [[5, 17, 200, 3, 99, 41, 7], [250, 1, 64, 128, 9], [33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43]]
GENERICS = {"Batch": 4, "MaxSeq": 32}
REPO = "linnet-test/Tiny-Llama"

CARD = f"""# The tiny Llama of these tests, as a card whose weights live in the Hugging Face cache.
card "tiny-cached"
import llama

config {{
  vocab = 256
  dim = 64
  layers = 3
  heads = 4
  kv_heads = 2
  ffn = 96
  norm_eps = 1e-5
  rope_theta = 10000.0
}}

meta {{
  hf_repo = "{REPO}"
}}
"""


@pytest.fixture
def assert_matches(prefill_error):
    def check(model, hf_model):
        assert max(prefill_error(model, hf_model, PROMPTS)) <= 1e-4
    return check


def test_written_sharded(tiny_hf):
    _, path = tiny_hf
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    assert len(list(path.glob("*.safetensors"))) >= 3


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_load_from_directory(tiny_hf, backend, assert_matches):
    hf_model, path = tiny_hf
    model = nest.load(path, backend=backend, generics=GENERICS, tokenizer=False)
    assert model.card == "Tiny-Llama" and model.weights == str(path)
    assert model.info["unused_tensors"] == []
    assert_matches(model, hf_model)


@pytest.fixture
def hf_home(tiny_hf, tmp_path, monkeypatch):
    """The tiny model in a fake $HF_HOME, laid out as huggingface_hub does: blobs, snapshot symlinks, refs/main."""
    _, path = tiny_hf
    repo = tmp_path / "hf" / "hub" / ("models--" + REPO.replace("/", "--"))
    rev = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(path.iterdir())):
        blob = repo / "blobs" / f"blob{i:04d}"
        shutil.copy(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LINNET_WEIGHTS"):
        monkeypatch.delenv(var, raising=False)
    card = tmp_path / "tiny-cached.linnet"
    card.write_text(CARD)
    return card, snapshot


def test_load_from_hf_cache(tiny_hf, hf_home, assert_matches):
    hf_model, _ = tiny_hf
    card, snapshot = hf_home
    model = nest.load(card, backend="torch", generics=GENERICS, tokenizer=False)
    assert model.weights == str(snapshot)
    assert_matches(model, hf_model)


def test_a_repository_id_loads_as_vllm_takes_one(tiny_hf, hf_home, assert_matches):
    """`vllm serve ORG/NAME` names a model by its repository: with no card for it, Linnet takes its
    copy in the Hugging Face cache (a card written from its config.json, named NAME); a repository
    neither a card names nor the cache holds says how to fetch it."""
    hf_model, _ = tiny_hf
    _, snapshot = hf_home
    model = nest.load(REPO, backend="torch", generics=GENERICS, tokenizer=False)
    assert model.card == "Tiny-Llama" and model.weights == str(snapshot)
    assert_matches(model, hf_model)
    with pytest.raises(nest.WeightsError, match="nor in the Hugging Face cache .* fetch it with `hf download "
                                                "linnet-test/Missing`"):
        nest.load("linnet-test/Missing", backend="torch", generics=GENERICS, tokenizer=False)


def test_a_repository_id_a_card_names_is_that_card():
    """The repository a card's meta hf_repo names, in any case (as the hub matches ids), is that
    card, whose weights are then looked for as the card's are (SmolLM2's: the embedded GGUF)."""
    from linnet.nest.load import resolve_card

    for repo in ("HuggingFaceTB/SmolLM2-135M-Instruct", "huggingfacetb/smollm2-135m-instruct"):
        assert resolve_card(repo, None)[1] == "smollm2-135m-instruct"
    assert resolve_card("meta-llama/Llama-3.1-8B-Instruct", None)[1] == "llama-3.1-8b-instruct"


def test_serve_names_the_model_by_the_repository_it_was_given(hf_home, tmp_path):
    """A client of `vllm serve ORG/NAME` sends "ORG/NAME" as its model: so does Linnet's server take it
    (and reply with it), beside the card's own name."""
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LINNET_WEIGHTS"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "linnet.cli", "serve", REPO, "--max-num-seqs", "2", "--max-model-len",
                             "32", "--dtype", "float32", "-tp", "1", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=60) as resp:
                    models = json.loads(resp.read())
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("the server did not answer in 2 minutes")
        assert [m["id"] for m in models["data"]][:1] == [REPO]
        body = json.dumps({"model": REPO, "prompt": [5, 17, 200], "max_tokens": 2}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            done = json.loads(resp.read())
        assert done["model"] == REPO and done["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_linnet_weights_dir_comes_before_the_cache(tiny_hf, hf_home, tmp_path, monkeypatch):
    _, path = tiny_hf
    card, _ = hf_home
    shutil.copytree(path, tmp_path / "mine" / "tiny-cached")
    monkeypatch.setenv("LINNET_WEIGHTS", str(tmp_path / "mine"))
    model = nest.load(card, backend="torch", generics=GENERICS, tokenizer=False)
    assert model.weights == str(tmp_path / "mine" / "tiny-cached")


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_bf16_cast(tiny_hf, backend, prefill_error):
    """T=bf16 from f32 files, with cast_dtype: bf16 rounding only (about 0.6% of the largest logit here)."""
    hf_model, path = tiny_hf
    model = nest.load(path, backend=backend, numerics="fast", generics={**GENERICS, "T": "bf16"}, cast_dtype=True,
                      tokenizer=False)
    assert model.dtype == "bf16"
    assert max(prefill_error(model, hf_model, PROMPTS)) < 0.02


def test_explicit_weights_win(tiny_hf, hf_home, tmp_path):
    """weights= overrides the search (here: the card's cache copy)."""
    _, path = tiny_hf
    card, _ = hf_home
    model = nest.load(card, backend="torch", generics=GENERICS, weights=path, tokenizer=False)
    assert model.weights == str(path)


def test_a_jax_load_does_not_import_torch(tiny_hf, tmp_path):
    """JAX binds numpy arrays: a fresh process loads the tiny Llama, stored in bf16 (numpy has no bf16
    of its own), without importing torch, and its logits are transformers'."""
    import subprocess
    import sys

    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file

    hf_model, path = tiny_hf
    bf16 = tmp_path / "bf16"
    shutil.copytree(path, bf16)
    for shard in bf16.glob("*.safetensors"):
        save_file({k: v.to(torch.bfloat16) for k, v in load_file(shard).items()}, shard, metadata={"format": "pt"})
    script = f"""
import sys
import numpy as np
from linnet import nest
model = nest.load({str(bf16)!r}, backend="jax", numerics="fast", generics={{**{GENERICS!r}, "T": "bf16"}},
                  tokenizer=False)
prompt = np.array({PROMPTS[0]!r}, np.int32)
n = len(prompt)
logits = model.prefill(prompt, np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.array([n - 1], np.int32))
np.save(sys.argv[1], np.asarray(logits, dtype=np.float32)[0])
print("torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "logits.npy")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
    ours = np.load(tmp_path / "logits.npy")
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1].numpy()
    assert np.abs(ours - ref).max() / np.abs(ref).max() < 0.02  # bf16 weights' rounding only


def test_shards_without_their_index_load_as_vllm_loads_them(tiny_hf, tmp_path, assert_matches):
    """A download that left out model.safetensors.index.json: the one set of model-0000i-of-0000N
    shards is read whole (vLLM reads every shard's header where there is no index; transformers
    refuses); a shard of the set missing, or a tensor in two shards, is an error naming the file."""
    from safetensors.torch import load_file, save_file

    from linnet.nest.errors import WeightsError

    hf_model, path = tiny_hf
    d = shutil.copytree(path, tmp_path / "no-index")
    (d / "model.safetensors.index.json").unlink()
    shards = sorted(d.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 3
    model = nest.load(d, backend="torch", generics=GENERICS, tokenizer=False)
    assert model.info["unused_tensors"] == []
    assert_matches(model, hf_model)
    first = load_file(shards[0])
    save_file({**first, **load_file(shards[1])}, shards[0])
    with pytest.raises(WeightsError, match=rf"{shards[1]}: holds tensor '[^']+', which {shards[0]} holds too"):
        nest.load(d, tokenizer=False)
    shards[1].unlink()
    with pytest.raises(WeightsError, match=rf"{shards[1]}: missing; shard 2 of {len(shards)} \(and no "
                                           r"model.safetensors.index.json"):
        nest.load(d, tokenizer=False)


def test_a_tensor_in_two_shards_is_read_from_the_one_the_index_names(tiny_hf, tmp_path, assert_matches):
    """Where model.safetensors.index.json is there, it says which shard holds a tensor, as transformers reads it:
    a copy of a tensor in another shard, earlier or later in the order read, holding other numbers, is not it."""
    import json

    from safetensors.torch import load_file, save_file

    hf_model, path = tiny_hf
    for other_first in (False, True):
        d = shutil.copytree(path, tmp_path / f"twice-{other_first}")
        weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
        shards = sorted(d.glob("model-*-of-*.safetensors"))
        named = next(n for n, shard in weight_map.items() if d / shard == shards[1])
        other = shards[0] if other_first else shards[-1]
        save_file({**load_file(other), named: load_file(shards[1])[named] + 1.0}, other)
        assert_matches(nest.load(d, backend="torch", generics=GENERICS, tokenizer=False), hf_model)


def test_a_weights_file_that_cannot_be_read_is_named_as_such(tiny_hf, tmp_path):
    """model.safetensors that is a directory, or a file this user may not read (the weights, config.json, a GGUF):
    each named with what is wrong with it (the safetensors library said "No such file or directory" of the second; the first was listed
    among the files found, beside "no model.safetensors")."""
    import subprocess
    import sys

    from linnet.nest.errors import WeightsError

    hf_model, _ = tiny_hf
    d = tmp_path / "dir"
    hf_model.save_pretrained(d)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").mkdir()
    with pytest.raises(WeightsError, match=rf"{d / 'model.safetensors'}: is a directory, not a file"):
        nest.load(d, tokenizer=False)
    # Root reads any file: as root the loads run without the two capabilities that let it (they stay root, so
    # they still read the Python and packages root owns, wherever they are installed).
    as_reader = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if as_reader and (shutil.which("setpriv") is None or subprocess.run([*as_reader, "true"]).returncode != 0):
        pytest.skip("root reads any file, and setpriv cannot take that from it here")
    hf_model.save_pretrained(weights := tmp_path / "weights")
    hf_model.save_pretrained(config := tmp_path / "config")
    (weights / "model.safetensors").chmod(0o000)
    (config / "config.json").chmod(0o000)
    (gguf := tmp_path / "model.gguf").write_bytes(b"GGUF")  # (what it holds is never read)
    gguf.chmod(0o000)
    script = ("import sys\nfrom linnet import nest\nfor path in sys.argv[1:]:\n    try:\n"
              "        nest.load(path, tokenizer=False)\n    except Exception as e:\n"
              "        print(type(e).__name__, e)\n")
    out = subprocess.run([*as_reader, sys.executable, "-c", script, str(weights), str(config), str(gguf)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert out.stdout.splitlines() == [f"WeightsError {file}: cannot be read (Permission denied)" for file in
                                       (weights / "model.safetensors", config / "config.json", gguf)], \
        out.stdout + out.stderr[-2000:]
