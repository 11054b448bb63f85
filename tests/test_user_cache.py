"""`linnet.user_cache`: where the cache lives, and entries written whole or not at all."""

from pathlib import Path

import pytest

from linnet import user_cache


def test_the_root_is_linnet_cache_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("LINNET_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache.directory("xla") == tmp_path / "home" / ".cache" / "linnet" / "xla"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache.directory("kernels") == tmp_path / "xdg" / "linnet" / "kernels"
    monkeypatch.setenv("LINNET_CACHE", str(tmp_path / "mine"))
    assert user_cache.directory("parser") == tmp_path / "mine" / "parser"


def test_an_entry_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "sub" / "entry"
    with user_cache.replacing(target) as tmp:
        Path(tmp).write_text("first")
        assert not target.exists()  # not until the block ends
    assert target.read_text() == "first"
    with pytest.raises(RuntimeError):
        with user_cache.replacing(target) as tmp:
            Path(tmp).write_text("half")
            raise RuntimeError("the writer failed")
    assert target.read_text() == "first"  # the old entry stands, and no temporary is left beside it
    assert sorted(p.name for p in target.parent.iterdir()) == ["entry"]


def test_no_home_is_an_os_error_that_says_what_to_set(no_home):
    with pytest.raises(OSError, match="set LINNET_CACHE"):
        user_cache.directory("kernels")


def test_the_cli_starts_without_a_home_for_the_cache(no_home):
    """`linnet` builds its flags' defaults from the cache's place: with none, XLA's cache is off."""
    from linnet.cli import build_parser

    args = build_parser().parse_args(["generate", "smollm2-135m-instruct", "hi"])
    assert args.compile_cache == "none"
