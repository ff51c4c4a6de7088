"""speculators 0.9.0 as a test-only oracle, read by file path.

``import speculators`` runs its package ``__init__``, which pulls its training stack
(``datasets``, ``hs_connectors``, ``loguru``), and install.sh installs it ``--no-deps``.
So nothing here imports the package: :func:`source_path` finds its directory through
``importlib.util.find_spec`` (which, for a top-level name, executes nothing), and
:func:`definitions` loads ``models/dspark/model_definitions.py`` (``MarkovHead``,
``ConfidenceHead``; it imports only torch) as a module of its own. :func:`trainer_function`
takes one pure function out of a file whose module imports are heavy (the vocabulary
mapping builder). :func:`dspark_model_class` imports speculators' own ``DSparkDraftModel``
(its loader, config schema and module tree) with the package's ``__init__`` and
``speculators.models``' ``__init__`` skipped (the only modules that reach the training
stack: ``models/eagle3/data.py`` imports ``datasets``), then takes the stand-ins out of
``sys.modules`` again. Absent package: the caller's test is skipped, saying so.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

VERSION = "0.9.0"


def source_path(relative: str) -> Path:
    """A file of the installed speculators package (skips the test when it is absent)."""
    spec = importlib.util.find_spec("speculators")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"speculators=={VERSION} is not installed (install.sh installs it with "
                    "--no-deps as a test-only oracle)")
    got = importlib.metadata.version("speculators")
    if got != VERSION:
        raise AssertionError(f"the oracle is speculators=={VERSION}, found {got}")
    return Path(next(iter(spec.submodule_search_locations))) / relative


def definitions() -> ModuleType:
    """speculators' ``models/dspark/model_definitions.py``, without the package."""
    path = source_path("models/dspark/model_definitions.py")
    spec = importlib.util.spec_from_file_location("speculators_dspark_model_definitions", path)
    if spec is None or spec.loader is None:
        raise AssertionError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trainer_function(relative: str, name: str, namespace: dict[str, Any]) -> Any:
    """The top-level function ``name`` of a speculators file, compiled alone in
    ``namespace`` (its module's imports are not run: it must need only ``namespace``)."""
    path = source_path(relative)
    tree = ast.parse(path.read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) != 1:
        raise AssertionError(f"{path} has no function {name!r}")
    scope = dict(namespace)
    code = compile(ast.Module(body=found, type_ignores=[]), str(path), "exec")
    exec(code, scope)  # noqa: S102 (the installed oracle's own function, nothing else)
    return scope[name]


@contextmanager
def dspark_model_class() -> Iterator[Any]:
    """speculators' ``DSparkDraftModel`` (module doc), usable inside the ``with`` (its
    ``from_pretrained`` imports more of the package lazily)."""
    root = source_path("__init__.py").parent
    saved = {k: m for k, m in sys.modules.items() if k == "speculators" or
             k.startswith("speculators.")}
    real = importlib.util.find_spec("speculators")
    try:
        for name, where in (("speculators", root), ("speculators.models", root / "models")):
            stub = ModuleType(name)
            stub.__path__ = [str(where)]
            stub.__spec__ = real if name == "speculators" else None
            sys.modules[name] = stub
        config = importlib.import_module("speculators.config")
        top = sys.modules["speculators"]
        for name in ("SpeculatorModelConfig", "SpeculatorsConfig", "VerifierConfig",
                     "reload_schemas"):
            setattr(top, name, getattr(config, name))
        top.SpeculatorModel = importlib.import_module("speculators.model").SpeculatorModel
        model = importlib.import_module("speculators.models.dspark.core").DSparkDraftModel
        config.reload_schemas()  # what the package __init__ ends with
        yield model
    finally:
        for k in [k for k in sys.modules if k == "speculators" or k.startswith("speculators.")]:
            del sys.modules[k]
        sys.modules.update(saved)


__all__ = ["VERSION", "definitions", "dspark_model_class", "source_path", "trainer_function"]
