"""Every core and plugin module imports cleanly with warnings as errors (pytest's test_meta).

Modules are discovered by walking ``core/draftwise`` and ``plugins/*/draftwise_*``, so a
new module is covered the moment it exists. Each import runs in a fresh interpreter
with ``-W error``, one subprocess for all modules, and every failure is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib, json, sys, traceback
failures = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException:
        failures[name] = traceback.format_exc(limit=-3)
print(json.dumps(failures))
"""


def module_names(package_dir: Path) -> list[str]:
    """Dotted names of every module under a package directory (packages included)."""
    names = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def all_modules() -> tuple[list[str], list[Path]]:
    names = module_names(ROOT / "core" / "draftwise")
    roots = []
    for package in sorted(ROOT.glob("plugins/*/draftwise_*")):
        if (package / "__init__.py").exists():
            names += module_names(package)
            roots.append(package.parent)
    return names, roots


def test_discovery_finds_core_and_every_plugin() -> None:
    names, _ = all_modules()
    assert "draftwise.config.speculative" in names and "draftwise.plugins.manager" in names
    for method in ("mtp", "dflash", "dspark", "ngram", "draft_model"):
        assert f"draftwise_{method}" in names and f"draftwise_{method}.options" in names


def test_every_module_imports_with_warnings_as_errors() -> None:
    names, roots = all_modules()
    env = dict(os.environ)
    paths = [str(ROOT / "core"), *map(str, roots), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT, json.dumps(names)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    failures = json.loads(result.stdout.splitlines()[-1])
    assert not failures, "\n\n".join(f"{name}:\n{tb}" for name, tb in failures.items())


def test_the_public_surface_imports_from_the_package() -> None:
    """``from draftwise import X`` for every name in ``__all__`` (EngineArgs included)."""
    import draftwise

    for name in draftwise.__all__:
        assert getattr(draftwise, name) is not None, name
    assert "EngineArgs" in draftwise.__all__
