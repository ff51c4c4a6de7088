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


def test_drafts_compare_by_value() -> None:
    """Issue 42 (D3): ``Drafts == Drafts`` compares the arrays instead of raising."""
    import numpy as np
    import torch

    from draftwise.speculator import Drafts

    a = Drafts.from_lists([[5, 6], [], [7]])
    assert a == Drafts.from_lists([[5, 6], [], [7]])
    assert a != Drafts.from_lists([[5, 6], [7], []])  # same tokens, other rows
    assert a != Drafts.from_lists([[5, 8], [], [7]])
    assert Drafts.empty(2) == Drafts.empty(2) and Drafts.empty(2) != Drafts.empty(3)
    assert a != Drafts(np.array([5, 6, 7]), [2, 0, 1], kv_valid=[3, 0, 2])
    q = torch.full((3, 4), 0.25)
    with_q = Drafts(np.array([5, 6, 7]), [2, 0, 1], draft_probs=q)
    assert with_q == Drafts(np.array([5, 6, 7]), [2, 0, 1], draft_probs=q.clone())
    assert with_q != a  # explicit q vs one-hot q
    assert a != [[5, 6], [], [7]]
    with pytest.raises(TypeError):
        hash(a)


def test_runtime_help_documents_the_contract_fields() -> None:
    """Issue 42 (D5): ``help()`` of the kit's contract types says what each field means."""
    import pydoc

    from draftwise import kit

    for name, fields in {
        "DraftRow": ("req_id", "token_ids", "max_draft", "num_kv_computed", "hidden"),
        "Drafts": ("token_ids", "num_draft_tokens", "draft_probs", "kv_valid", "evidence"),
        "Speculator": ("method", "options", "make_proposer", "refusals", "capabilities"),
        "ProposerContext": ("vocab_size", "draft", "target", "kv_cache"),
    }.items():
        text = pydoc.render_doc(getattr(kit, name), renderer=pydoc.plaintext)
        for f in fields:
            assert f"    {f}: " in text, f"{name}.{f} is not described in help()"
    assert "register(speculator)" in pydoc.render_doc(kit.RegisterSpeculator,
                                                      renderer=pydoc.plaintext)
