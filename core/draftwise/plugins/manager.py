"""Plugin discovery and the typed wrappers around every hook.

The core finds plugins itself: sorted ``importlib.metadata.entry_points(group="draftwise")``,
each registered in one ``pluggy.PluginManager("draftwise")`` as ``"<dist>:<entry point>"``,
with our own plugin -> distribution map (pluggy's ``load_setuptools_entrypoints`` would
silently drop a second entry point of the same name). A plugin that fails to import, a
hookimpl that matches no hookspec, and two distributions claiming one method are startup
errors. This is the only module that touches ``pm.hook``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from draftwise.plugins import hookspecs
from draftwise.plugins.errors import (
    PluginError,
    PluginImportError,
    PluginRegistrationError,
    PluginSelectionError,
)
from draftwise.plugins.registry import (
    DistInfo,
    Registration,
    SpeculatorRegistry,
    validate_speculator,
)
from draftwise.speculator import Speculator

if TYPE_CHECKING:
    import click
    from pluggy import HookImpl

#: entry-point group and pluggy project name
GROUP = "draftwise"
#: comma-separated entry-point or distribution names to load; set but empty loads none
ENV_VAR = "DRAFTWISE_PLUGINS"


def new_plugin_manager() -> pluggy.PluginManager:
    """A fresh PluginManager that knows draftwise's hookspecs."""
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    return pm


def normalize_dist_name(name: str) -> str:
    """PEP 503 normalisation, so ``draftwise_ngram`` and ``Draftwise-Ngram`` match."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class PluginHost:
    """One PluginManager plus the distribution of every plugin registered in it.

    Tests build a fresh one and register in-test plugin classes with :meth:`register`.
    """

    pm: pluggy.PluginManager = field(default_factory=new_plugin_manager)
    #: installed entry points that the plugin selection left out
    excluded: list[DistInfo] = field(default_factory=list)
    #: what discovery saw when this host loaded (see :func:`entry_point_fingerprint`)
    discovered: tuple[tuple[str, str, str, str], ...] = ()
    _dists: dict[str, DistInfo] = field(default_factory=dict, init=False, repr=False)

    def register(self, plugin: object, dist: DistInfo) -> None:
        """Register ``plugin`` as ``"<dist>:<entry point>"``, remembering its distribution."""
        try:
            self.pm.register(plugin, name=dist.plugin_name)
        except pluggy.PluginValidationError as exc:
            raise PluginRegistrationError(f"plugin {dist.plugin_name} ({dist}): {exc}") from exc
        except ValueError as exc:  # the same module under two names, or a name taken
            raise PluginRegistrationError(f"plugin {dist.plugin_name} ({dist}): {exc}") from exc
        self._dists[dist.plugin_name] = dist

    def dist_of(self, plugin: object) -> DistInfo:
        """The distribution that registered ``plugin`` (a placeholder for foreign ones)."""
        name = self.pm.get_name(plugin) or repr(plugin)
        return self._dists.get(name) or DistInfo(name=name, version="", entry_point=name)

    def plugins(self) -> list[tuple[object, DistInfo]]:
        """Registered plugins with their distributions, in registration order."""
        return [(p, self.dist_of(p)) for _, p in self.pm.list_name_plugin()]

    def check_pending(self) -> None:
        """Fail on hookimpls that match no hookspec (a misspelt hook would be ignored)."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            dist = self.dist_of(exc.plugin)
            raise PluginRegistrationError(f"plugin {dist.plugin_name} ({dist}): {exc}") from exc


def parse_selection(value: str | None) -> frozenset[str] | None:
    """``DRAFTWISE_PLUGINS`` as a set of names; None (unset) means load everything."""
    if value is None:
        return None
    return frozenset(n.strip() for n in value.split(",") if n.strip())


def _dist_info(ep: importlib.metadata.EntryPoint) -> DistInfo:
    dist = ep.dist
    name = dist.name if dist is not None else "(unknown distribution)"
    version = dist.version if dist is not None else ""
    return DistInfo(name=name, version=version, entry_point=ep.name, module=ep.value)


def discover(group: str = GROUP) -> list[tuple[importlib.metadata.EntryPoint, DistInfo]]:
    """Installed entry points of ``group`` with their distributions, in a stable order."""
    found = [(ep, _dist_info(ep)) for ep in importlib.metadata.entry_points(group=group)]
    return sorted(found, key=lambda pair: (pair[0].name, pair[1].name, pair[0].value))


def entry_point_fingerprint(
    found: list[tuple[importlib.metadata.EntryPoint, DistInfo]],
) -> tuple[tuple[str, str, str, str], ...]:
    """What identifies a discovery result: so a later scan can tell whether anything changed."""
    return tuple((ep.name, ep.value, d.name, d.version) for ep, d in found)


def _selected(dist: DistInfo, selection: frozenset[str] | None) -> bool:
    if selection is None:
        return True
    names = {n for n in selection} | {normalize_dist_name(n) for n in selection}
    return dist.entry_point in names or normalize_dist_name(dist.name) in names


def load_entry_point_plugins(
    host: PluginHost, selection: str | None = None, group: str = GROUP
) -> PluginHost:
    """Import and register every selected entry point of ``group``, then check the hooks.

    :param selection: the value of ``DRAFTWISE_PLUGINS`` (None: load all). A name matches
        an entry-point name (``ngram``) or a distribution name (``draftwise-ngram``).
    """
    wanted = parse_selection(selection)
    found = discover(group)
    host.discovered = entry_point_fingerprint(found)
    if wanted:
        known = {d.entry_point for _, d in found} | {normalize_dist_name(d.name) for _, d in found}
        missing = sorted(
            n for n in wanted if n not in known and normalize_dist_name(n) not in known
        )
        if missing:
            installed = ", ".join(f"{d.entry_point} ({d})" for _, d in found) or "none"
            raise PluginSelectionError(
                f"{ENV_VAR} names {', '.join(repr(m) for m in missing)}, which no installed "
                f"plugin provides; installed plugins: {installed}"
            )
    for ep, dist in found:
        if not _selected(dist, wanted):
            host.excluded.append(dist)
            continue
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginImportError(
                f"plugin {dist.plugin_name} ({dist}) failed to import {ep.value!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        host.register(plugin, dist)
    host.check_pending()
    return host


def _call(impl: HookImpl, dist: DistInfo, hook: str, **kwargs: Any) -> None:
    """Call one plugin's hookimpl with the (opt-in) arguments it takes."""
    try:
        impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
    except PluginError:
        raise
    except Exception as exc:
        raise PluginRegistrationError(
            f"plugin {dist.plugin_name} ({dist}): {hook} raised {type(exc).__name__}: {exc}"
        ) from exc


def collect_registrations(host: PluginHost) -> list[Registration]:
    """Call each plugin's ``register_speculators`` separately, tagging its distribution."""
    regs: list[Registration] = []
    for impl in host.pm.hook.register_speculators.get_hookimpls():
        dist = host.dist_of(impl.plugin)
        mine: list[Speculator] = []
        register: hookspecs.RegisterSpeculator = mine.append
        _call(impl, dist, "register_speculators", register=register)
        regs.extend(Registration(spec, dist) for spec in mine)
    return regs


def load_speculators(host: PluginHost | None = None) -> SpeculatorRegistry:
    """The registry of every installed method (cached for the default host).

    :raises DuplicateMethodError: two registrations claim one method or alias.
    :raises PluginError: a plugin failed to import or registered something malformed.
    """
    if host is None:
        return _default_registry(os.environ.get(ENV_VAR))
    return SpeculatorRegistry(collect_registrations(host), excluded=host.excluded)


def register_commands(cli: click.Group, host: PluginHost | None = None) -> None:
    """Let every plugin add its subcommands to ``cli``."""
    host = host or get_plugin_host()
    builtin = set(getattr(cli, "lazy_commands", {}))
    for impl in host.pm.hook.register_commands.get_hookimpls():
        dist = host.dist_of(impl.plugin)
        before = dict(cli.commands)
        _call(impl, dist, "register_commands", cli=cli)
        for name, command in cli.commands.items():
            if (name in builtin or name in before) and before.get(name) is not command:
                raise PluginRegistrationError(
                    f"plugin {dist.plugin_name} ({dist}) registers command '{name}', which "
                    "another command already has; plugins add commands, never replace them"
                )


#: what ``draftwise plugins`` says of a method that the engine can run
RUNS = "runs"
#: ... of a method declared without a proposer (its configs are checked, it cannot run)
DECLARED_ONLY = "declared only: its proposer is not built yet, so the engine refuses it"


@dataclass(frozen=True, slots=True)
class PluginSummary:
    """One row of ``draftwise plugins``."""

    dist: DistInfo
    hooks: tuple[str, ...]
    methods: tuple[str, ...]
    aliases: tuple[str, ...]
    #: method -> whether it runs: ``RUNS``, ``DECLARED_ONLY`` or the conflict that stops it
    status: tuple[tuple[str, str], ...] = ()
    #: method -> its speculator's one-line description
    descriptions: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``draftwise plugins --json`` prints."""
        return {
            "name": self.dist.plugin_name,
            "distribution": self.dist.name,
            "version": self.dist.version,
            "entry_point": self.dist.entry_point,
            "module": self.dist.module,
            "hooks": list(self.hooks),
            "methods": list(self.methods),
            "aliases": list(self.aliases),
            "status": dict(self.status),
            "descriptions": dict(self.descriptions),
        }


def summarize(host: PluginHost) -> list[PluginSummary]:
    """What each loaded plugin provides, for ``draftwise plugins``.

    Built from the registrations themselves, not from a registry: two distributions
    claiming one name are shown (each such method's status names the other claimant)
    instead of making the listing fail. A malformed registration still raises.
    """
    regs = collect_registrations(host)
    for reg in regs:
        validate_speculator(reg.speculator, reg.dist)
    claims: dict[str, list[Registration]] = {}
    for reg in regs:
        for name in (reg.speculator.method, *reg.speculator.aliases):
            claims.setdefault(name, []).append(reg)
    out = []
    for plugin, dist in host.plugins():
        callers = host.pm.get_hookcallers(plugin) or []
        specs = [r.speculator for r in regs if r.dist == dist]
        status = []
        for spec in specs:
            others = sorted(
                {f"'{name}' also claimed by {other.dist}"
                 for name in (spec.method, *spec.aliases)
                 for other in claims[name] if other.dist != dist}
            )
            if others:
                status.append((spec.method, "conflict: " + "; ".join(others)))
            else:
                status.append((spec.method, RUNS if spec.make_proposer else DECLARED_ONLY))
        out.append(
            PluginSummary(
                dist=dist,
                hooks=tuple(sorted(c.name for c in callers)),
                methods=tuple(s.method for s in specs),
                aliases=tuple(a for s in specs for a in s.aliases),
                status=tuple(status),
                descriptions=tuple((s.method, s.description) for s in specs),
            )
        )
    return sorted(out, key=lambda s: (s.dist.name, s.dist.entry_point))


@functools.cache
def _default_host(selection: str | None) -> PluginHost:
    return load_entry_point_plugins(PluginHost(), selection)


@functools.cache
def _default_registry(selection: str | None) -> SpeculatorRegistry:
    return load_speculators(_default_host(selection))


def get_plugin_host() -> PluginHost:
    """The process's plugins, loaded once per ``DRAFTWISE_PLUGINS`` value."""
    return _default_host(os.environ.get(ENV_VAR))


def refresh_if_plugins_changed() -> bool:
    """Forget the process's plugins if the installed entry points changed since they loaded.

    Why: the default registry is loaded once per process, so a plugin installed (or a
    ``*.dist-info`` put on ``sys.path``) after the first engine would stay invisible and be
    refused as unknown. Called only when a config names a method the registry lacks, so
    the ordinary path never re-scans. Returns whether anything changed (the caller then
    loads the registry again, once).
    """
    if _default_host.cache_info().currsize == 0:
        return False  # nothing loaded yet: the next load scans anyway
    importlib.invalidate_caches()  # a path entry's directory listing may be cached
    if entry_point_fingerprint(discover()) == get_plugin_host().discovered:
        return False
    reset_plugin_cache()
    return True


def reset_plugin_cache() -> None:
    """Forget the loaded plugins (tests; after installing a plugin in-process)."""
    _default_host.cache_clear()
    _default_registry.cache_clear()


__all__ = [
    "DECLARED_ONLY",
    "ENV_VAR",
    "GROUP",
    "RUNS",
    "PluginHost",
    "PluginSummary",
    "collect_registrations",
    "discover",
    "entry_point_fingerprint",
    "get_plugin_host",
    "load_entry_point_plugins",
    "load_speculators",
    "new_plugin_manager",
    "normalize_dist_name",
    "parse_selection",
    "refresh_if_plugins_changed",
    "register_commands",
    "reset_plugin_cache",
    "summarize",
]
