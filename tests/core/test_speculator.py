"""``LazyLoader``: a registered loader that imports its module only when a draft is detected."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from draftwise.plugins.errors import PluginImportError
from draftwise.speculator import DraftCheckpoint, LazyLoader


def test_imports_the_module_at_first_detect_and_builds_the_loader_once(
    tmp_path, monkeypatch
) -> None:
    (tmp_path / "lazy_probe_loader.py").write_text(textwrap.dedent("""
        from draftwise.speculator import DraftCheckpoint
        BUILT = []
        class Probe:
            def __init__(self):
                BUILT.append(self)
            def detect(self, path):
                return DraftCheckpoint(path, "x", "probe")
            def load(self, checkpoint, options, target):
                return ("loaded", checkpoint.path, target)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    loader = LazyLoader("lazy_probe_loader:Probe")
    assert "lazy_probe_loader" not in sys.modules  # looked up, not imported
    ckpt = loader.detect("/d")
    assert ckpt == DraftCheckpoint("/d", "x", "probe")
    assert loader.load(ckpt, None, "t") == ("loaded", "/d", "t")
    assert len(sys.modules["lazy_probe_loader"].BUILT) == 1
    monkeypatch.delitem(sys.modules, "lazy_probe_loader")


@pytest.mark.parametrize("target", ["no_such_module_xyz:Loader", "no_colon", ":Cls", "mod:"])
def test_a_bad_name_fails_when_registered(target: str) -> None:
    with pytest.raises(ValueError, match="LazyLoader"):
        LazyLoader(target)


def test_a_module_that_fails_to_import_is_a_plugin_error_at_detect(tmp_path, monkeypatch) -> None:
    (tmp_path / "lazy_broken_loader.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loader = LazyLoader("lazy_broken_loader:Loader")
    with pytest.raises(PluginImportError, match="lazy_broken_loader:Loader.*RuntimeError: boom"):
        loader.detect("/d")


def test_loading_every_installed_plugin_imports_no_torch() -> None:
    """Registration runs in every command; check-config and plugins must stay light."""
    code = (
        "import sys\n"
        "from draftwise.plugins.manager import load_speculators\n"
        "registry = load_speculators()\n"
        "assert {'dflash', 'dspark'} <= set(registry.methods()), registry.methods()\n"
        "print(sorted(m for m in ('torch', 'safetensors', 'jinja2') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
