"""``draftwise serve`` refuses a bad speculative config by name, before loading weights.

(The full process path, answering and exiting 0 on SIGTERM, is the last test of
``test_server.py``, which serves its n-gram engine with ``draftwise serve``.)
"""

from __future__ import annotations

import json
import time

from click.testing import CliRunner
from draftwise.cli.serve import serve


def test_refused_speculative_config_exits_2_naming_the_key():
    bad = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_mx": 3})
    t0 = time.monotonic()
    result = CliRunner().invoke(serve, ["--port", "0", "--speculative-config", bad])
    assert result.exit_code == 2, result.output
    assert "prompt_lookup_mx" in result.output
    assert "Traceback" not in result.output
    assert time.monotonic() - t0 < 10  # refused before any weights are read


def test_unknown_method_exits_2():
    result = CliRunner().invoke(serve, ["--speculative-config", '{"method": "nope"}'])
    assert result.exit_code == 2
    assert "nope" in result.output
