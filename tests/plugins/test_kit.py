"""The plugin kit is the only door into draftwise for plugins (``draftwise/kit.py``).

- Every ``draftwise`` import in ``plugins/*/draftwise_*`` and in the docs' example plugins
  (``docs/examples/``; module level, function level and ``TYPE_CHECKING`` alike, found by
  walking the AST) is ``from draftwise.kit import``.
- Every kit name resolves, and the kit imports lazily: importing it, and the names a
  plugin's registration needs, loads no torch.
- Both target families implement the declared :class:`~draftwise.target.TargetModel`
  surface, and a loaded model is a :class:`~draftwise.target.LoadedTarget`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def plugin_sources() -> list[Path]:
    return sorted(ROOT.glob("plugins/*/draftwise_*/**/*.py"))


def outside_kit(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: module`` for each draftwise import that does not go through the kit."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if (name == "draftwise" or name.startswith("draftwise.")) and name != "draftwise.kit":
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def test_plugins_import_only_the_kit() -> None:
    sources = plugin_sources()
    assert len(sources) > 30  # every first-party plugin's modules were found
    bad = [line for path in sources for line in outside_kit(path)]
    assert not bad, "plugins must import draftwise only through draftwise.kit:\n" + "\n".join(bad)


def test_the_docs_example_plugin_imports_only_the_kit() -> None:
    """docs/examples/ is what a third party copies: it is held to the same rule."""
    sources = sorted(ROOT.glob("docs/examples/*/*/**/*.py"))
    assert len(sources) >= 3  # medusa_lite's __init__, options, proposer
    bad = [line for path in sources for line in outside_kit(path)]
    assert not bad, "the docs' example plugins must import draftwise only through the kit:\n" + (
        "\n".join(bad))


def test_the_check_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from draftwise.models.llama import DecoderLayer\n"
                   "def f():\n    import draftwise.formats.gguf\n"
                   "    from draftwise.kit import linear\n"
                   "from draftwise import hookimpl\n")
    got = [line.split(": ")[1] for line in outside_kit(src, tmp_path)]
    assert got == ["draftwise.models.llama", "draftwise.formats.gguf", "draftwise"]


def test_every_kit_name_resolves() -> None:
    from draftwise import kit

    for name in kit.__all__:
        assert getattr(kit, name) is not None, name
    with pytest.raises(AttributeError, match="plugin kit holds"):
        kit.LlamaForCausalLM  # noqa: B018 - an internal is not in the kit


def test_the_kit_and_registration_names_load_no_torch() -> None:
    code = ("import sys\nfrom draftwise.kit import Speculator, Refusal, Capabilities, hookimpl\n"
            "from draftwise.kit import ConfigError, RefusedValueError, SpeculativeConfig\n"
            "import draftwise_ngram, draftwise_mtp, draftwise_dflash, draftwise_dspark\n"
            "import draftwise_draft_model\nprint('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_both_target_families_implement_the_surface(tmp_path: Path) -> None:
    from draftwise.models.loader import load_model
    from draftwise.target import HybridTargetModel, LoadedTarget, TargetModel
    from tiny_checkpoints import save_tiny, save_tiny_hybrid

    llama = load_model(str(save_tiny("llama", tmp_path / "llama")))
    assert isinstance(llama, LoadedTarget) and isinstance(llama.model, TargetModel)
    assert not isinstance(llama.model, HybridTargetModel)
    hybrid = load_model(str(save_tiny_hybrid(tmp_path / "hybrid", mtp=False)))
    assert isinstance(hybrid, LoadedTarget) and isinstance(hybrid.model, HybridTargetModel)
    n = llama.config.num_hidden_layers
    assert len(llama.model.layers) == n  # taps are 0 .. n-1
    import torch

    ids = torch.tensor([1, 2, 3])
    h = llama.model.embed(ids)
    assert h.shape == (3, llama.config.hidden_size)
    logits = llama.model.lm_head(llama.model.final_norm(h))
    assert logits.shape == (3, llama.config.vocab_size) and logits.dtype == torch.float32
