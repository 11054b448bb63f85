"""Linnet: one `.linnet` model source, lowered to PyTorch or JAX, served by `linnet.serve`."""

__version__ = "0.1.0"
