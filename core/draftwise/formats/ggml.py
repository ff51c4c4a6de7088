"""gguf-py's format constants (``gguf.constants``), imported without the rest of gguf-py.

Why not ``from gguf import ...``: importing any part of gguf-py first runs its package
``__init__``, which imports its reader, writer, lazy tensors, vocabulary and YAML metadata
modules: 30 of the 40 ms it costs, on the start-up path of every command that opens a
GGUF, for tables the engine reads from ``constants`` alone (a module that imports only
the standard library). So this executes gguf-py's own ``constants.py`` as the module
``gguf.constants``: the same file, registered under its own name, so a later
``import gguf`` (the dequantization of a type the kernels do not cover, a test) reuses it
and every enum member stays one object across both. The one difference: the package
object then lacks the ``constants`` attribute (``gguf.constants.X`` raises; import it by
name instead, as this project does).

Where gguf-py is already imported, or its ``constants.py`` cannot be found or run on its
own (another gguf-py layout), this is an ordinary import of the package.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "gguf.constants"


def _load() -> ModuleType:
    """``gguf.constants``: from ``sys.modules``, else run on its own, else imported."""
    if _NAME in sys.modules or "gguf" in sys.modules:
        return importlib.import_module(_NAME)
    package = importlib.util.find_spec("gguf")  # locates the package; runs nothing
    places = package.submodule_search_locations if package is not None else None
    spec = None
    if places:
        path = Path(next(iter(places))) / "constants.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(_NAME, path)
    if spec is None or spec.loader is None:
        return importlib.import_module(_NAME)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # it needs the package after all: import it the ordinary way
        del sys.modules[_NAME]
        return importlib.import_module(_NAME)
    return module


_C = _load()

GGML_QUANT_SIZES: dict = _C.GGML_QUANT_SIZES
GGUF_DEFAULT_ALIGNMENT: int = _C.GGUF_DEFAULT_ALIGNMENT
QK_K: int = _C.QK_K
GGMLQuantizationType = _C.GGMLQuantizationType
GGUFValueType = _C.GGUFValueType
Keys = _C.Keys

__all__ = [
    "GGML_QUANT_SIZES", "GGUF_DEFAULT_ALIGNMENT", "QK_K", "GGMLQuantizationType",
    "GGUFValueType", "Keys",
]
