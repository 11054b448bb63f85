"""Find a model's weights on this machine, without any network access.

Order (first hit wins):
  1. each explicit local path in `extra_dirs` (a model directory or a .gguf file);
  2. the Hugging Face hub cache, `<cache>/models--ORG--NAME/snapshots/<rev>/`,
     where <cache> is $HF_HUB_CACHE if set, then $HF_HOME/hub (HF_HOME
     defaults to $XDG_CACHE_HOME/huggingface, i.e. ~/.cache/huggingface);
     within it the revision named by refs/main, else the newest snapshot.

Every place looked is returned, so that a "weights not found" error can list
them along with the command that fetches the weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .checkpoint import CONFIG_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX


def hub_cache_dirs() -> list[Path]:
    """Hugging Face hub cache directories to search, most specific first."""
    dirs = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]).expanduser())
    if os.environ.get("HF_HOME"):
        home = Path(os.environ["HF_HOME"]).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        home = Path(xdg).expanduser() / "huggingface"
    dirs.append(home / "hub")
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def is_model_dir(path: Path) -> bool:
    """A directory holding config.json and safetensors weights (single or indexed)."""
    return (path / CONFIG_FILE).is_file() and (
        (path / SAFETENSORS_FILE).is_file() or (path / SAFETENSORS_INDEX).is_file()
    )


def shown_places(looked: list[str]) -> list[str]:
    """Each place looked, as an error lists it: a folder there that holds no model says what it lacks (a
    snapshot a download stopped short in holds config.json and not the weights, or a link to a blob that
    was never finished)."""
    return [f"{p} ({lacks})" if (lacks := _lacks(Path(p))) else p for p in looked]


def _lacks(path: Path) -> str | None:
    if not path.is_dir() or is_model_dir(path):
        return None
    said = [] if (path / CONFIG_FILE).is_file() else [f"no {CONFIG_FILE}"]
    weights = path / SAFETENSORS_FILE
    if weights.is_symlink() and not weights.exists():  # (the hub links a file to its blob once it is whole)
        said.append(f"{SAFETENSORS_FILE} links to {os.readlink(weights)}, which is not there")
    elif not weights.is_file() and not (path / SAFETENSORS_INDEX).is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        said.append(f"no {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX}"
                    + (f"; it holds {', '.join(ggufs[:3])}{' ...' if len(ggufs) > 3 else ''}: give a .gguf file's "
                       f"path" if ggufs else ""))
    return ", ".join(said)


def _repo_folder(repo_id: str) -> str:
    # the hub cache's own naming: "HuggingFaceTB/SmolLM2-135M" -> "models--HuggingFaceTB--SmolLM2-135M"
    return "models--" + repo_id.replace("/", "--")


def _snapshot(repo_dir: Path, looked: list[str]) -> Path | None:
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text().strip()
        candidate = snapshots / rev
        looked.append(str(candidate))
        if is_model_dir(candidate):
            return candidate
    if not snapshots.is_dir():
        looked.append(str(snapshots))
        return None
    revs = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for candidate in revs:
        if str(candidate) in looked:
            continue
        looked.append(str(candidate))
        if is_model_dir(candidate):
            return candidate
    if not revs:
        looked.append(str(snapshots))
    return None


def find_weights(hf_repo_id: str, extra_dirs: Iterable[str | os.PathLike] = ()) -> tuple[str | None, list[str]]:
    """(path of the weights or None, every place looked), in the order above."""
    looked: list[str] = []
    for extra in extra_dirs:
        p = Path(extra).expanduser()
        looked.append(str(p))
        if (p.is_file() and p.suffix.lower() == ".gguf") or (p.is_dir() and is_model_dir(p)):
            return str(p), looked
    for cache in hub_cache_dirs():
        repo_dir = cache / _repo_folder(hf_repo_id)
        if not repo_dir.is_dir():
            looked.append(str(repo_dir))
            continue
        found = _snapshot(repo_dir, looked)
        if found is not None:
            return str(found), looked
    return None, looked


def download_command(hf_repo_id: str) -> str:
    # `hf`, huggingface_hub's command since 0.34: 1.0 removed `huggingface-cli`, which now is no command
    return f"hf download {hf_repo_id}"


def weights_not_found_message(hf_repo_id: str, looked: list[str]) -> str:
    """The text of a "weights not found" error: where we looked, how to fetch."""
    places = "\n".join(f"  {p}" for p in shown_places(looked)) or "  (nowhere)"
    return (
        f"weights for {hf_repo_id} not found; looked in:\n{places}\n"
        f"fetch them with:\n  {download_command(hf_repo_id)}\n"
        "or give the path of a local model directory or .gguf file (weights=PATH; --weights PATH on the "
        "command line)"
    )
