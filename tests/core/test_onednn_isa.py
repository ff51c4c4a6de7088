"""draftwise caps oneDNN below AMX on import (rows of its bf16 GEMM then never depend on
M; see draftwise/onednn_isa.py), and keeps a cap the user set."""

from __future__ import annotations

import os
import subprocess
import sys

from draftwise.onednn_isa import CAP, ENV


def _isa_after_import(env: dict[str, str]) -> str:
    code = f"import os, draftwise; print(os.environ.get({ENV!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_import_caps_onednn_below_amx() -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    assert _isa_after_import(env) == CAP


def test_a_cap_the_user_set_is_kept() -> None:
    assert _isa_after_import({**os.environ, ENV: "AVX2"}) == "AVX2"


def test_this_process_runs_under_the_cap() -> None:
    # the suite imports draftwise before any GEMM: the linear tests' batch invariance on
    # an AMX machine rests on it
    assert os.environ.get(ENV) in (CAP, "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI")
