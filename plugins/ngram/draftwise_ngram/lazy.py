"""A proposer factory that imports its proposer only when one is built.

Both methods of this distribution (``ngram``, ``suffix``) declare their options at
import time, which must stay cheap (``draftwise plugins`` and ``check-config`` import
every plugin), and build their proposer module only for a run. One factory maker, so the
import-or-refuse rule is written once: a missing proposer module is the method's
:class:`ProposerNotBuiltError`; any other import error (a dependency of the module) is
raised as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from draftwise.kit import Proposer, ProposerContext, ProposerNotBuiltError
from pydantic import BaseModel


def lazy_factory(method: str, module: str, attr: str,
                 options_type: type[BaseModel]) -> Callable[[BaseModel, ProposerContext], Proposer]:
    """``make_proposer`` for ``method``: ``module.attr(options, ctx)``, imported on first use."""

    def make(options: BaseModel, ctx: ProposerContext) -> Proposer:
        try:
            cls = getattr(importlib.import_module(module), attr)
        except ImportError as exc:  # ModuleNotFoundError included
            if exc.name != module:
                raise
            raise ProposerNotBuiltError(method) from exc
        if not isinstance(options, options_type):
            raise TypeError(f"{method} needs {options_type.__name__}, got "
                            f"{type(options).__name__}")
        proposer: Proposer = cls(options, ctx)
        return proposer

    make.__doc__ = f"Build method {method}'s proposer (``{module}.{attr}``), imported now."
    return make


__all__ = ["lazy_factory"]
