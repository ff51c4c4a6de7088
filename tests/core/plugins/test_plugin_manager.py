"""Discovery, attribution and startup errors of the plugin manager."""

from __future__ import annotations

import click
import pytest
from pydantic import BaseModel, ConfigDict

from draftwise import hookimpl
from draftwise.config import UnknownMethodError, parse_speculative_config
from draftwise.plugins import (
    DistInfo,
    DuplicateMethodError,
    PluginHost,
    PluginImportError,
    PluginRegistrationError,
    PluginSelectionError,
    get_plugin_host,
    load_entry_point_plugins,
    load_speculators,
    register_commands,
    reset_plugin_cache,
    summarize,
)
from draftwise.plugins.manager import DECLARED_ONLY, discover, parse_selection
from draftwise.speculator import Speculator

FIVE = {"dflash", "draft_model", "dspark", "mtp", "ngram", "suffix"}  # five distributions


class Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    window: int = 3


class LookaheadPlugin:
    """An in-test plugin: a sixth method, with an alias."""

    @hookimpl
    def register_speculators(self, register) -> None:
        register(Speculator(method="lookahead", options=Opts, aliases=("la",)))


class AcmeNgramPlugin:
    @hookimpl
    def register_speculators(self, register) -> None:
        register(Speculator(method="ngram", options=Opts))


def dist(name: str, version: str = "1.0", ep: str = "x") -> DistInfo:
    return DistInfo(name=name, version=version, entry_point=ep, module=name.replace("-", "_"))


def test_in_test_plugin_on_a_fresh_host(plugin_host: PluginHost) -> None:
    plugin_host.register(LookaheadPlugin(), dist("acme-lookahead", "2.0", "lookahead"))
    registry = load_speculators(plugin_host)
    assert registry.methods() == ("lookahead",)
    spec, info = registry.get("la")
    assert spec.method == "lookahead"
    assert (info.name, info.version, info.plugin_name) == (
        "acme-lookahead",
        "2.0",
        "acme-lookahead:lookahead",
    )
    assert registry.aliases() == {"la": "lookahead"}


def test_hookimpls_may_take_fewer_arguments(plugin_host: PluginHost) -> None:
    class NoArgs:
        @hookimpl
        def register_speculators(self) -> None:
            pass

    plugin_host.register(NoArgs(), dist("quiet"))
    assert load_speculators(plugin_host).methods() == ()


def test_two_distributions_claiming_one_method(plugin_host: PluginHost, installed_registry) -> None:
    ngram = installed_registry.get("ngram")
    plugin_host.register(AcmeNgramPlugin(), dist("acme-ngram", "2.0", "acme"))

    class FirstParty:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(ngram.speculator)

    plugin_host.register(FirstParty(), ngram.dist)
    with pytest.raises(DuplicateMethodError) as info:
        load_speculators(plugin_host)
    assert str(info.value) == (
        "'ngram' is claimed twice: as method 'ngram' by acme-ngram 2.0, and as method 'ngram' "
        "by draftwise-ngram 0.1.0; uninstall one of the two distributions, or load one with "
        "DRAFTWISE_PLUGINS"
    )


def test_alias_colliding_with_a_method(plugin_host: PluginHost) -> None:
    class LaMethod:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(Speculator(method="la", options=Opts))

    plugin_host.register(LookaheadPlugin(), dist("acme-lookahead", "2.0"))
    plugin_host.register(LaMethod(), dist("other", "0.3"))
    with pytest.raises(
        DuplicateMethodError,
        match="as an alias of method 'lookahead' by acme-lookahead 2.0, and as method 'la' by "
        "other 0.3",
    ):
        load_speculators(plugin_host)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("not a speculator", "which is not a draftwise.speculator.Speculator"),
        (Speculator(method="Bad-Name", options=Opts), "names must match"),
        (Speculator(method="x", options=Opts, aliases=("x",)), "lists itself as an alias"),
        (Speculator(method="x", options=dict), "must be a pydantic BaseModel subclass"),  # type: ignore[arg-type]
        (
            Speculator(method="x", options=BaseModel),
            "must set model_config = ConfigDict(extra='forbid')",
        ),
    ],
)
def test_malformed_registrations_name_the_distribution(
    plugin_host: PluginHost, spec, message: str
) -> None:
    class Bad:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(spec)

    plugin_host.register(Bad(), dist("acme-bad", "0.1"))
    with pytest.raises(PluginRegistrationError) as info:
        load_speculators(plugin_host)
    assert "acme-bad 0.1" in str(info.value) and message in str(info.value)


def test_options_may_not_claim_core_keys(plugin_host: PluginHost) -> None:
    class Sneaky(BaseModel):
        model_config = ConfigDict(extra="forbid")
        num_speculative_tokens: int = 3

    class Plugin:
        @hookimpl
        def register_speculators(self, register) -> None:
            register(Speculator(method="sneaky", options=Sneaky))

    plugin_host.register(Plugin(), dist("sneaky"))
    with pytest.raises(
        PluginRegistrationError, match=r"declare core keys \['num_speculative_tokens'\]"
    ):
        load_speculators(plugin_host)


def test_a_hook_that_raises_names_the_plugin(plugin_host: PluginHost) -> None:
    class Boom:
        @hookimpl
        def register_speculators(self, register) -> None:
            raise KeyError("oops")

    plugin_host.register(Boom(), dist("acme-boom", "0.2", "boom"))
    with pytest.raises(PluginRegistrationError) as info:
        load_speculators(plugin_host)
    assert str(info.value) == (
        "plugin acme-boom:boom (acme-boom 0.2): register_speculators raised KeyError: 'oops'"
    )


def test_misspelt_hook_fails_check_pending(make_dist) -> None:
    make_dist(
        "acme-typo",
        "0.1",
        {"typo": "acme_typo"},
        {
            "acme_typo": (
                "from draftwise import hookimpl\n\n"
                "@hookimpl\ndef register_speculator(register):\n    pass\n"
            )
        },
    )
    with pytest.raises(PluginRegistrationError) as info:
        load_entry_point_plugins(PluginHost(), selection="typo")
    assert "plugin acme-typo:typo (acme-typo 0.1)" in str(info.value)
    assert "register_speculator" in str(info.value)


def test_plugin_failing_to_import_is_an_error_naming_it(make_dist) -> None:
    make_dist(
        "acme-broken",
        "0.3",
        {"broken": "acme_broken"},
        {"acme_broken": "import a_module_that_does_not_exist\n"},
    )
    with pytest.raises(PluginImportError) as info:
        load_entry_point_plugins(PluginHost(), selection=None)
    assert str(info.value) == (
        "plugin acme-broken:broken (acme-broken 0.3) failed to import 'acme_broken': "
        "ModuleNotFoundError: No module named 'a_module_that_does_not_exist'"
    )


def test_entry_points_are_registered_as_dist_colon_ep(make_dist) -> None:
    make_dist("acme-lookahead", "2.0", {"lookahead": "acme_lookahead"}, {"acme_lookahead": ""})
    host = load_entry_point_plugins(PluginHost(), selection=None)
    names = [name for name, _ in host.pm.list_name_plugin()]
    assert "acme-lookahead:lookahead" in names
    assert {f"draftwise-{m.replace('_', '-')}:{m}" for m in FIVE - {"suffix"}} <= set(names)
    eps = [ep.name for ep, _ in discover()]
    assert eps == sorted(eps)


def test_duplicate_entry_point_names_both_load(make_dist) -> None:
    """pluggy's own loader would silently drop the second ``ngram`` entry point."""
    make_dist(
        "acme-ngram",
        "2.0",
        {"ngram": "acme_ngram"},
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
    host = load_entry_point_plugins(PluginHost(), selection="ngram")
    assert {d.name for _, d in host.plugins()} == {"acme-ngram", "draftwise-ngram"}
    with pytest.raises(DuplicateMethodError) as info:
        load_speculators(host)
    assert "acme-ngram 2.0" in str(info.value) and "draftwise-ngram 0.1.0" in str(info.value)


@pytest.mark.parametrize(
    ("selection", "methods"),
    [
        (None, FIVE),
        ("ngram,mtp", {"ngram", "suffix", "mtp"}),
        ("draftwise-dflash", {"dflash"}),
        (" draftwise_draft_model , ngram ", {"draft_model", "ngram", "suffix"}),
        ("Draftwise-DSpark", {"dspark"}),
        ("", set()),
    ],
)
def test_draftwise_plugins_selection(selection: str | None, methods: set[str]) -> None:
    host = load_entry_point_plugins(PluginHost(), selection=selection)
    registry = load_speculators(host)
    assert set(registry.methods()) == methods
    # (draftwise-ngram serves two methods: ngram and suffix)
    assert len(registry.excluded) == 5 - len(methods - {"suffix"})


def test_selection_naming_nothing_installed() -> None:
    with pytest.raises(PluginSelectionError) as info:
        load_entry_point_plugins(PluginHost(), selection="ngram,eagle")
    assert str(info.value).startswith(
        "DRAFTWISE_PLUGINS names 'eagle', which no installed plugin provides; installed plugins: "
    )


def test_parse_selection() -> None:
    assert parse_selection(None) is None
    assert parse_selection("") == frozenset()
    assert parse_selection("a, b,,") == {"a", "b"}


def test_env_var_drives_the_default_host(monkeypatch, fresh_plugin_cache) -> None:
    monkeypatch.setenv("DRAFTWISE_PLUGINS", "ngram")
    assert load_speculators().methods() == ("ngram", "suffix")
    with pytest.raises(UnknownMethodError) as info:
        parse_speculative_config({"method": "mtp", "num_speculative_tokens": 1})
    assert str(info.value).startswith(
        "method 'mtp' is provided by draftwise-mtp 0.1.0, which is installed but not loaded; "
        "add mtp to DRAFTWISE_PLUGINS, or unset it."
    )
    monkeypatch.delenv("DRAFTWISE_PLUGINS")
    assert set(load_speculators().methods()) == FIVE


def test_default_host_is_cached_until_reset(fresh_plugin_cache) -> None:
    host = get_plugin_host()
    assert get_plugin_host() is host
    assert load_speculators() is load_speculators()
    reset_plugin_cache()
    assert get_plugin_host() is not host


MEDUSA_SOURCE = """
from pydantic import BaseModel, ConfigDict
from draftwise import hookimpl
from draftwise.speculator import Speculator

class Opts(BaseModel):
    model_config = ConfigDict(extra="forbid")
    heads: int = 4

@hookimpl
def register_speculators(register):
    register(Speculator(method="medusa", options=Opts))
"""


def test_a_plugin_added_after_the_first_load_is_found(
    make_dist, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42 (D0): the default registry is cached per process; a config naming a method
    (or an option key) it lacks re-scans the entry points once, so a plugin registered
    after the first engine is found instead of refused as unknown."""
    monkeypatch.delenv("DRAFTWISE_PLUGINS", raising=False)
    before = load_speculators()
    assert "medusa" not in before.methods()
    with pytest.raises(UnknownMethodError):  # nothing changed: refused, cache kept
        parse_speculative_config({"method": "medusa", "num_speculative_tokens": 2})
    assert load_speculators() is before
    make_dist("acme-medusa", "1.0", {"medusa": "acme_medusa"}, {"acme_medusa": MEDUSA_SOURCE})
    resolved = parse_speculative_config({"method": "medusa", "heads": 2, "num_speculative_tokens": 2})
    assert resolved is not None and resolved.method == "medusa"
    assert "medusa" in load_speculators().methods() and load_speculators() is not before


def test_summarize(plugin_host: PluginHost) -> None:
    plugin_host.register(LookaheadPlugin(), dist("acme-lookahead", "2.0", "lookahead"))
    [row] = summarize(plugin_host)
    assert row.to_json() == {
        "name": "acme-lookahead:lookahead",
        "distribution": "acme-lookahead",
        "version": "2.0",
        "entry_point": "lookahead",
        "module": "acme_lookahead",
        "hooks": ["register_speculators"],
        "methods": ["lookahead"],
        "aliases": ["la"],
        "status": {"lookahead": DECLARED_ONLY},
        "descriptions": {"lookahead": ""},
    }


def test_register_commands(plugin_host: PluginHost) -> None:
    class Commands:
        @hookimpl
        def register_commands(self, cli: click.Group) -> None:
            @cli.command()
            def hello() -> None:
                click.echo("hi")

    plugin_host.register(Commands(), dist("acme-cmd"))
    group = click.Group()
    register_commands(group, plugin_host)
    assert "hello" in group.commands


def test_plugin_commands_never_replace_others(plugin_host: PluginHost) -> None:
    from draftwise.cli import make_cli

    class Hijack:
        @hookimpl
        def register_commands(self, cli: click.Group) -> None:
            cli.add_command(click.Command("plugins"))

    plugin_host.register(Hijack(), dist("acme-hijack", "0.1", "hijack"))
    with pytest.raises(PluginRegistrationError, match="registers command 'plugins'"):
        register_commands(make_cli(), plugin_host)
