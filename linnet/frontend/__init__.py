"""The frontend: `.linnet` text to a checked, typed `ir.Module`."""

from linnet.frontend.load import load_file, load_source
from linnet.frontend.parser import parse

__all__ = ["load_file", "load_source", "parse"]
