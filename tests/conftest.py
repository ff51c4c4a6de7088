"""Fixtures shared across the test tree. Keep it small: one fixture per idea."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from draftwise.plugins import PluginHost, SpeculatorRegistry, load_entry_point_plugins
from draftwise.plugins.manager import load_speculators, reset_plugin_cache

# Loading a GGUF writes its packed weights to a file cache in the user's cache folder
# (``models.packed_cache``), keyed by the model's path: tests load hundreds of tiny files
# from temporary folders and would leave one file each. Off for the whole run (child
# processes included); the cache's own tests turn it on over a temporary folder.
os.environ.setdefault("DRAFTWISE_PACKED_CACHE", "0")
# Adaptive depth, the default with speculation on, keeps each model's measured cost grid
# in the same cache folder: the run's grids go to a folder of its own, removed at exit.
if "DRAFTWISE_CACHE_DIR" not in os.environ:
    os.environ["DRAFTWISE_CACHE_DIR"] = tempfile.mkdtemp(prefix="draftwise-test-cache-")
    atexit.register(shutil.rmtree, os.environ["DRAFTWISE_CACHE_DIR"], True)

#: make_dist(name, version, entry_points={ep_name: module}, modules={module: source}) -> dir
MakeDist = Callable[..., Path]


@pytest.fixture(scope="session")
def installed_registry() -> SpeculatorRegistry:
    """The installed speculators, from a private host (ignores DRAFTWISE_PLUGINS)."""
    return load_speculators(load_entry_point_plugins(PluginHost(), selection=None))


@pytest.fixture
def plugin_host() -> PluginHost:
    """A fresh PluginManager with no plugins; register in-test plugin classes on it."""
    return PluginHost()


@pytest.fixture
def fresh_plugin_cache() -> Iterator[None]:
    """Forget the process-wide plugin cache before and after a test that changes plugins."""
    reset_plugin_cache()
    yield
    reset_plugin_cache()


@pytest.fixture
def make_dist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_plugin_cache: None
) -> Iterator[MakeDist]:
    """Fake an installed distribution (a .dist-info + modules) on sys.path, no pip needed."""
    created: list[str] = []

    def make(
        name: str,
        version: str,
        entry_points: dict[str, str],
        modules: dict[str, str],
    ) -> Path:
        root = tmp_path / f"site-{name}"
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        eps = "".join(f"{ep} = {target}\n" for ep, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[draftwise]\n{eps}")
        for module, source in modules.items():
            (root / f"{module}.py").write_text(source)
            created.append(module)
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        return root

    yield make
    for module in created:
        sys.modules.pop(module, None)


@pytest.fixture
def wrong_accept_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """verify accepts with min(1, q/p) instead of min(1, p/q): a distribution test that
    still passes under it proves nothing."""
    import numpy as np

    import draftwise.spec.verify as verify_mod

    monkeypatch.setattr(
        verify_mod, "_standard_accept_prob",
        lambda p_x, q_x: np.minimum(1.0, q_x / np.maximum(p_x, 1e-30)),
    )
