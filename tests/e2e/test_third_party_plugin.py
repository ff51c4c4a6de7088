"""A sixth method added by ``pip install`` alone, and two distributions claiming one method.

Each test builds a tiny distribution, installs it with pip (offline, no build isolation)
into a private ``--target`` directory, and runs ``draftwise`` in a subprocess with that
directory on PYTHONPATH: exactly what a user's ``pip install acme-lookahead`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from draftwise.config.adaptive import AdaptiveConfig
from draftwise.plugins.manager import DECLARED_ONLY

PLUGIN_SOURCE = '''
"""acme-lookahead: a third-party draftwise speculator."""

from pydantic import BaseModel, ConfigDict, Field

from draftwise.kit import Capabilities, Refusal, Speculator, hookimpl


class LookaheadOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    lookahead_window: int = Field(4, ge=1)


@hookimpl
def register_speculators(register):
    register(
        Speculator(
            method="lookahead",
            options=LookaheadOptions,
            aliases=("jacobi",),
            refusals=(
                Refusal("enforce_eager", "lookahead needs its compiled step", "drop it",
                        values=(True,)),
            ),
            capabilities=Capabilities(needs_checkpoint=False),
            description="Lookahead decoding (Jacobi iterations), no draft model.",
        )
    )
'''

DUPLICATE_SOURCE = """
from pydantic import BaseModel, ConfigDict

from draftwise.kit import Speculator, hookimpl


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


@hookimpl
def register_speculators(register):
    register(Speculator(method="ngram", options=Options))
"""


def build_and_install(tmp: Path, dist: str, version: str, ep: str, source: str) -> Path:
    """Write a one-module distribution and pip-install it into its own --target dir."""
    module = dist.replace("-", "_")
    src = tmp / f"src-{dist}"
    src.mkdir()
    (src / f"{module}.py").write_text(source)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "{version}"
        dependencies = ["draftwise"]

        [project.entry-points.draftwise]
        {ep} = "{module}"

        [tool.setuptools]
        py-modules = ["{module}"]
    """)
    )
    target = tmp / f"site-{dist}"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return target


def draftwise(target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DRAFTWISE_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", "from draftwise.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=target,
    )


@pytest.fixture(scope="module")
def lookahead(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_and_install(
        tmp_path_factory.mktemp("lookahead"), "acme-lookahead", "1.2.0", "lookahead", PLUGIN_SOURCE
    )


def test_sixth_method_appears_in_plugins(lookahead: Path) -> None:
    result = draftwise(lookahead, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = {r["distribution"]: r for r in json.loads(result.stdout)}
    assert rows["acme-lookahead"] == {
        "name": "acme-lookahead:lookahead",
        "distribution": "acme-lookahead",
        "version": "1.2.0",
        "entry_point": "lookahead",
        "module": "acme_lookahead",
        "hooks": ["register_speculators"],
        "methods": ["lookahead"],
        "aliases": ["jacobi"],
        "status": {"lookahead": DECLARED_ONLY},
        "descriptions": {"lookahead": "Lookahead decoding (Jacobi iterations), no draft model."},
    }
    assert {m for r in rows.values() for m in r["methods"]} == {
        "dflash",
        "draft_model",
        "dspark",
        "lookahead",
        "mtp",
        "ngram",
        "suffix",
    }


def test_sixth_method_passes_check_config(lookahead: Path) -> None:
    result = draftwise(lookahead, "check-config", '{"method":"jacobi","num_speculative_tokens":3}')
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "method": "lookahead",
        "num_speculative_tokens": 3,
        "draft_sample_method": "greedy",
        "rejection_sample_method": "standard",
        "lookahead_window": 4,
        # a third party's method gets the default depth rule too
        "draftwise": {"adaptive": AdaptiveConfig().model_dump(mode="json")},
    }
    assert "method 'jacobi' is an alias of 'lookahead'" in result.stderr


def test_sixth_method_options_and_refusals_are_checked(lookahead: Path) -> None:
    result = draftwise(
        lookahead,
        "check-config",
        '{"method":"lookahead","num_speculative_tokens":3,"lookahead_windw":2}',
    )
    assert result.returncode == 2
    assert "did you mean 'lookahead_window'?" in result.stderr
    result = draftwise(
        lookahead,
        "check-config",
        '{"method":"lookahead","num_speculative_tokens":3,"enforce_eager":true}',
    )
    assert result.returncode == 2
    assert result.stderr.startswith(
        "error: enforce_eager=true is refused by method 'lookahead': lookahead needs its "
        "compiled step. Instead: drop it."
    )


def test_two_distributions_claiming_ngram(tmp_path: Path) -> None:
    target = build_and_install(tmp_path, "acme-ngram", "2.0.0", "ngram", DUPLICATE_SOURCE)
    result = draftwise(target, "plugins", "--json")  # shows the conflict, still works
    assert result.returncode == 0, result.stderr
    rows = {r["distribution"]: r for r in json.loads(result.stdout)}
    assert rows["acme-ngram"]["status"]["ngram"].startswith("conflict: 'ngram' also claimed")
    assert "'ngram' is claimed twice" in result.stderr
    assert "acme-ngram 2.0.0" in result.stderr and "draftwise-ngram 0.1.0" in result.stderr
    assert draftwise(target, "--version").returncode == 0
    refused = draftwise(target, "check-config", '{"method":"ngram","num_speculative_tokens":2}')
    assert refused.returncode == 1 and "'ngram' is claimed twice" in refused.stderr
