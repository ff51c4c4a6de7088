"""``draftwise serve`` wiring with click's CliRunner: engine and uvicorn stubbed out."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from draftwise.cli.serve import serve
from draftwise.errors import EngineConfigError
from server_fakes import FakeEngine


@pytest.fixture
def stubs(monkeypatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def build_engine(model, speculative_config, dtype, reserved=None, **kwargs):
        seen["build"] = (model, speculative_config, dtype, kwargs)
        seen["reserved"] = reserved
        if speculative_config == "refuse":
            raise EngineConfigError("speculative_config: 'bogus' is not a known key")
        return FakeEngine()

    def run_server(app, host, port, **kwargs):
        seen["run"] = (app, host, port, kwargs)
        kwargs["on_ready"](f"http://{host}:{port}")

    monkeypatch.setattr("draftwise.cli.common.build_engine", build_engine)
    monkeypatch.setattr("draftwise.server.runner.serve", run_server)
    return seen


def test_options_reach_engine_and_app(stubs):
    result = CliRunner().invoke(serve, [
        "--model", "/models/x.gguf", "--port", "9000", "--max-num-seqs", "4",
        "--speculative-config", '{"method": "ngram"}', "--served-model-name", "a",
        "--served-model-name", "b", "--api-key", "k", "--return-spec-metrics",
        "--dtype", "float32", "--max-model-len", "512", "--shutdown-timeout", "3"])
    assert result.exit_code == 0, result.output
    assert stubs["build"] == ("/models/x.gguf", '{"method": "ngram"}', "float32",
                              {"max_num_seqs": 4, "max_model_len": 512})
    assert stubs["reserved"] is None  # float32: nothing stays quantized, nothing prefaulted
    app, host, port, kwargs = stubs["run"]
    assert (host, port, kwargs["shutdown_timeout"]) == ("127.0.0.1", 9000, 3.0)
    config = app.state.serving.config
    assert config.served_model_names == ("a", "b")
    assert config.api_key == "k" and config.return_spec_metrics
    assert "serving 'a' on http://127.0.0.1:9000" in result.output


def test_threads_reach_the_engine(stubs):
    result = CliRunner().invoke(serve, ["--threads", "2"])
    assert result.exit_code == 0, result.output
    assert stubs["build"][3] == {"max_num_seqs": 32, "num_threads": 2}


def test_num_kv_blocks_reaches_the_engine(stubs):
    result = CliRunner().invoke(serve, ["--num-kv-blocks", "768"])
    assert result.exit_code == 0, result.output
    assert stubs["build"][3] == {"max_num_seqs": 32, "num_kv_blocks": 768}
    result = CliRunner().invoke(serve, ["--num-kv-blocks", "1"])
    assert result.exit_code == 2 and "--num-kv-blocks" in result.output


def test_logprobs_mode_reaches_the_engine(stubs):
    result = CliRunner().invoke(serve, ["--logprobs-mode", "processed_logprobs"])
    assert result.exit_code == 0, result.output
    assert stubs["build"][3] == {"max_num_seqs": 32, "logprobs_mode": "processed_logprobs"}
    result = CliRunner().invoke(serve, ["--logprobs-mode", "cooked"])
    assert result.exit_code == 2 and "--logprobs-mode" in result.output


def test_default_served_name_is_the_model_argument(stubs):
    result = CliRunner().invoke(serve, ["--model", "/models/x.gguf"])
    assert result.exit_code == 0, result.output
    assert stubs["run"][0].state.serving.config.served_model_names == ("/models/x.gguf",)


def test_refusal_exits_2_before_serving(stubs):
    result = CliRunner().invoke(serve, ["--speculative-config", "refuse"])
    assert result.exit_code == 2
    assert "bogus" in result.output
    assert "run" not in stubs


def test_limit_flags_reach_the_server_config(stubs):
    result = CliRunner().invoke(serve, [
        "--max-request-bytes", "65536", "--header-timeout", "2.5", "--body-timeout", "7",
        "--keep-alive-timeout", "1.5", "--max-connections", "9", "--first-byte-timeout", "0.75",
        "--enable-docs"])
    assert result.exit_code == 0, result.output
    config = stubs["run"][0].state.serving.config
    assert (config.limits.max_request_bytes, config.limits.header_timeout,
            config.limits.body_timeout, config.limits.keep_alive_timeout,
            config.limits.max_connections, config.limits.first_byte_timeout) == (
        65536, 2.5, 7.0, 1.5, 9, 0.75)
    assert config.enable_docs


def test_defaults_are_the_documented_limits(stubs):
    from draftwise.server.limits import ServerLimits

    result = CliRunner().invoke(serve, [])
    assert result.exit_code == 0, result.output
    config = stubs["run"][0].state.serving.config
    assert config.limits == ServerLimits() and not config.enable_docs
    assert config.api_key is None


@pytest.mark.parametrize(("args", "env"), [
    (["--api-key", ""], {}),
    ([], {"DRAFTWISE_API_KEY": ""}),
    (["--api-key", "has space"], {}),
])
def test_unusable_api_key_is_a_startup_error(stubs, args, env):
    result = CliRunner().invoke(serve, args, env=env)
    assert result.exit_code == 2, result.output
    assert "api_key" in result.output
    assert "build" not in stubs  # refused before any weights load


def test_api_key_from_the_environment(stubs):
    result = CliRunner().invoke(serve, [], env={"DRAFTWISE_API_KEY": "k2"})
    assert result.exit_code == 0, result.output
    assert stubs["run"][0].state.serving.config.api_key == "k2"


@pytest.mark.parametrize("args", [["--header-timeout", "0"], ["--max-connections", "0"],
                                  ["--max-request-bytes", "10"], ["--first-byte-timeout", "0"]])
def test_out_of_range_limits_are_usage_errors(stubs, args):
    result = CliRunner().invoke(serve, args)
    assert result.exit_code == 2 and "build" not in stubs


def test_replicas_with_tensor_parallel_are_refused_by_name(stubs):
    """--replicas runs one-process CPU engines: a split engine per replica is refused at
    once (exit 2, names both options), never started."""
    result = CliRunner().invoke(serve, ["--replicas", "2", "--tensor-parallel-size", "2"])
    assert result.exit_code == 2, result.output
    assert "--tensor-parallel-size" in result.output and "--replicas" in result.output
    assert "build" not in stubs
