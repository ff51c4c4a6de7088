"""The hookspec module stays small, documented and registration-shaped."""

from __future__ import annotations

import inspect
from pathlib import Path

from draftwise.plugins import hookspecs, new_plugin_manager


def test_hookspecs_are_few_documented_and_registration_shaped() -> None:
    assert len(Path(hookspecs.__file__).read_text().splitlines()) < 150
    pm = new_plugin_manager()
    names = sorted(n for n in dir(pm.hook) if not n.startswith("_"))
    assert names == ["register_commands", "register_speculators"]
    for name in names:
        spec = getattr(hookspecs, name)
        opts = spec.draftwise_spec  # set by HookspecMarker("draftwise")
        assert not (opts.get("firstresult") or opts.get("historic")), name
        doc = inspect.getdoc(spec) or ""
        assert ":param" in doc and ":returns:" in doc, name
