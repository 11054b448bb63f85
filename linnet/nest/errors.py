"""Errors that nest raises about weights and tokenizers.

Each message names the file or directory at fault, so a user can act on it
without reading a traceback.
"""


class WeightsError(Exception):
    """A checkpoint is missing, incomplete, corrupt, or lacks a tensor asked for."""


class TokenizerError(Exception):
    """A tokenizer cannot be built from the files given, or a chat template fails."""


class DeviceError(ValueError):
    """A device that this process cannot run a model on (no such device, or a library without it)."""


class CardError(KeyError):
    """A card name that is not in the registry; the message suggests the close names."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""
