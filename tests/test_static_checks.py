"""Static checks the suite runs: pyflakes' rules over the whole tree, strict types on the
plugin surface and the step record.

Why in the suite rather than beside it: CI runs the README's one test command, so a check
that is not a test is a check nobody runs. The rules are pinned with the tools' versions
(``pyproject.toml``'s ``test`` extra), so a new release cannot fail a green tree.

- ``ruff --select F`` (undefined names, unused imports, shadowing, redefinitions) over
  core, plugins, tests, benchmarks, scripts and the docs' example plugins: an undefined
  name in a rarely taken branch (a reduced-vocabulary summary line) shipped once before
  this check existed.
- ``mypy --strict`` on ``draftwise.kit``, ``draftwise.target``, ``draftwise.spec.step`` and
  ``draftwise.step_clock``: the declared surface third-party plugins and the engine step
  build on. Imports are followed silently: the rest of core is typed but not yet held to
  ``--strict``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STRICT = ["core/draftwise/kit.py", "core/draftwise/target.py", "core/draftwise/spec/step.py",
          "core/draftwise/formats/weight_types.py",
          "core/draftwise/step_clock.py"]


def _tool(name: str) -> list[str]:
    if shutil.which(name) is None:
        pytest.fail(f"{name} is not installed: it is in the test extra (pip install -e .[test])")
    return [sys.executable, "-m", name]


def test_pyflakes_rules_pass_everywhere() -> None:
    done = subprocess.run([*_tool("ruff"), "check", "--select", "F", "--no-cache", "core",
                           "plugins", "tests", "benchmarks", "scripts", "docs/examples"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_the_plugin_surface_and_the_step_type_check_strictly() -> None:
    done = subprocess.run([*_tool("mypy"), "--strict", "--follow-imports=silent",
                           "--no-incremental", *STRICT],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
