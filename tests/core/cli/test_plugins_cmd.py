"""``draftwise plugins`` and the root group, through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from draftwise import __version__, hookimpl
from draftwise.cli import CliState, cli, main
from draftwise.plugins import DistInfo, PluginHost, load_entry_point_plugins
from draftwise.speculator import Speculator

FIVE = {
    "draftwise-dflash": ["dflash"],
    "draftwise-draft-model": ["draft_model"],
    "draftwise-dspark": ["dspark"],
    "draftwise-mtp": ["mtp"],
    "draftwise-ngram": ["ngram", "suffix"],  # one distribution, two model-free methods
}


class Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")


@pytest.fixture
def installed_host() -> PluginHost:
    return load_entry_point_plugins(PluginHost(), selection=None)


def test_plugins_json_lists_the_five_first_party_methods(installed_host: PluginHost) -> None:
    result = CliRunner().invoke(cli, ["plugins", "--json"], obj=CliState(installed_host))
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {r["distribution"]: r["methods"] for r in rows} == FIVE
    status = {m: s for r in rows for m, s in r["status"].items()}
    assert status == {
        "ngram": "runs", "mtp": "runs", "draft_model": "runs", "dflash": "runs",
        "dspark": "runs", "suffix": "runs",
    }
    ngram = next(r for r in rows if r["distribution"] == "draftwise-ngram")
    assert ngram["descriptions"]["suffix"].startswith("Suffix decoding")
    dflash = next(r for r in rows if r["distribution"] == "draftwise-dflash")
    assert "Formats: safetensors directory" in dflash["descriptions"]["dflash"]
    mtp = next(r for r in rows if r["distribution"] == "draftwise-mtp")
    assert mtp["descriptions"]["mtp"].startswith("Multi-token-prediction heads")
    assert mtp["version"] == "0.1.0" and mtp["entry_point"] == "mtp"
    assert mtp["name"] == "draftwise-mtp:mtp" and mtp["module"] == "draftwise_mtp"
    assert mtp["hooks"] == ["register_speculators"]
    assert len(mtp["aliases"]) == 26 and "deepseek_mtp" in mtp["aliases"]


def test_plugins_table(installed_host: PluginHost) -> None:
    result = CliRunner().invoke(cli, ["plugins"], obj=CliState(installed_host))
    assert result.exit_code == 0
    for name in FIVE:
        assert name in result.stdout
    assert "dspark: runs" in result.stdout and "dflash: runs" in result.stdout and "ngram: runs" in result.stdout
    assert "suffix: runs" in result.stdout
    assert "deepseek_mtp" in result.stdout and "(26 in" in result.stdout
    # the methods table says what each runs and which formats it reads
    flat = " ".join(result.stdout.split())
    assert "What it runs (formats)" in result.stdout
    assert "NVFP4 ModelOpt" in flat and "Qwen3DSparkModel" in flat


def test_plugins_with_an_in_test_host(plugin_host: PluginHost) -> None:
    class Plugin:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(Speculator(method="lookahead", options=Opts))

    plugin_host.register(Plugin(), DistInfo("acme-lookahead", "2.0", "lookahead", "acme_lookahead"))
    result = CliRunner().invoke(cli, ["plugins", "--json"], obj=CliState(plugin_host))
    assert json.loads(result.stdout)[0]["methods"] == ["lookahead"]


def test_no_plugins(plugin_host: PluginHost) -> None:
    result = CliRunner().invoke(cli, ["plugins"], obj=CliState(plugin_host))
    assert result.exit_code == 0 and "no plugins loaded" in result.stdout
    result = CliRunner().invoke(cli, ["plugins", "--json"], obj=CliState(plugin_host))
    assert json.loads(result.stdout) == []


def test_plugin_error_exits_1(plugin_host: PluginHost) -> None:
    class Broken:
        @hookimpl
        def register_speculators(self, register) -> None:
            register("nonsense")

    plugin_host.register(Broken(), DistInfo("acme-broken", "0.1", "broken"))
    result = CliRunner().invoke(cli, ["plugins"], obj=CliState(plugin_host))
    assert result.exit_code == 1
    assert "error: acme-broken 0.1 registered 'nonsense'" in result.stderr


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"draftwise, version {__version__}\n"


def test_help_lists_the_built_in_commands() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("check-config", "plugins", "generate", "bench", "serve"):
        assert name in result.stdout


def duplicate_ngram(make_dist) -> None:
    make_dist(
        "acme-ngram",
        "2.0.0",
        {"acme": "acme_ngram"},
        {
            "acme_ngram": (
                "from pydantic import BaseModel, ConfigDict\n"
                "from draftwise import hookimpl\nfrom draftwise.speculator import Speculator\n"
                "class O(BaseModel):\n    model_config = ConfigDict(extra='forbid')\n"
                "@hookimpl\ndef register_speculators(register):\n"
                "    register(Speculator(method='ngram', options=O))\n"
            )
        },
    )


def test_a_duplicate_method_refuses_commands_that_need_the_registry(
    make_dist, capsys, monkeypatch
) -> None:
    monkeypatch.delenv("DRAFTWISE_PLUGINS", raising=False)
    duplicate_ngram(make_dist)
    with pytest.raises(SystemExit) as info:
        main(["check-config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "error: 'ngram' is claimed twice" in err
    assert "acme-ngram 2.0.0" in err and "draftwise-ngram 0.1.0" in err
    assert "(set DRAFTWISE_PLUGINS to load only some plugins)" in err


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["generate", "--help"]])
def test_a_duplicate_method_leaves_help_and_version_working(
    make_dist, capsys, monkeypatch, args
) -> None:
    monkeypatch.delenv("DRAFTWISE_PLUGINS", raising=False)
    duplicate_ngram(make_dist)
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 0
    out, err = capsys.readouterr()
    assert out and "warning: 'ngram' is claimed twice" in err


def test_plugins_shows_the_conflict_and_what_cannot_run(make_dist, capsys, monkeypatch) -> None:
    monkeypatch.delenv("DRAFTWISE_PLUGINS", raising=False)
    duplicate_ngram(make_dist)
    with pytest.raises(SystemExit) as info:
        main(["plugins", "--json"])
    assert info.value.code == 0
    out, err = capsys.readouterr()
    rows = {r["distribution"]: r for r in json.loads(out)}
    assert rows["acme-ngram"]["status"] == {
        "ngram": "conflict: 'ngram' also claimed by draftwise-ngram 0.1.0"
    }
    assert rows["draftwise-ngram"]["status"]["ngram"].startswith("conflict: 'ngram' also")
    assert rows["draftwise-mtp"]["status"] == {"mtp": "runs"}
    assert rows["draftwise-dflash"]["status"] == {"dflash": "runs"}
    assert rows["draftwise-dspark"]["status"] == {"dspark": "runs"}
    assert "warning: 'ngram' is claimed twice" in err


def test_main_adds_plugin_commands(make_dist, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTWISE_PLUGINS", "hello,ngram")
    make_dist(
        "acme-hello",
        "0.1",
        {"hello": "acme_hello"},
        {
            "acme_hello": (
                "import click\nfrom draftwise import hookimpl\n"
                "@hookimpl\ndef register_commands(cli):\n"
                "    @cli.command()\n    def hello():\n        click.echo('hello from a plugin')\n"
            )
        },
    )
    with pytest.raises(SystemExit) as info:
        main(["hello"])
    assert info.value.code == 0
    assert capsys.readouterr().out == "hello from a plugin\n"
