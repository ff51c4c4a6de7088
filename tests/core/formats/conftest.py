"""The tiny GGUF fixture (files written by ``tests/tiny_gguf.py``)."""

from __future__ import annotations

# the writer and the fixture are shared with the model tests
from tiny_gguf import TinyGGUF, tiny_gguf, write_tiny_gguf  # noqa: F401
