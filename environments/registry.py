"""Find environments through the `elr_rl.environments` entry-point group.

A new environment is a module plus one line in pyproject.toml
(`name = "package.module:Class"`), or a separate pip package declaring the
same group: nothing in this project lists environments by hand.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import threading

from environments.base import Environment

GROUP = "elr_rl.environments"

_lock = threading.Lock()
_instances: dict[str, Environment] = {}


@functools.cache
def _entry_points() -> dict[str, md.EntryPoint]:
    """name -> entry point; the same name pointing at two different classes is an error."""
    found: dict[str, md.EntryPoint] = {}
    for ep in md.entry_points(group=GROUP):
        prev = found.get(ep.name)
        if prev is not None and prev.value != ep.value:
            raise ValueError(
                f"environment {ep.name!r} is registered twice ({prev.value} and {ep.value}); "
                "uninstall one of the packages or rename one entry point"
            )
        found[ep.name] = ep
    return found


def refresh() -> None:
    """Forget what was discovered (after a pip install in this process)."""
    importlib.invalidate_caches()
    _entry_points.cache_clear()
    load_env_class.cache_clear()
    with _lock:
        _instances.clear()


def entry_point(name: str) -> md.EntryPoint:
    """The entry point registering `name` (its `.dist` says which package provides it)."""
    eps = _entry_points()
    if name not in eps:
        raise ValueError(f"unknown environment {name!r}; registered environments: {', '.join(sorted(eps))}")
    return eps[name]


def list_envs() -> list[str]:
    """Names of every registered environment, sorted."""
    return sorted(_entry_points())


@functools.cache
def load_env_class(name: str) -> type[Environment]:
    """Import the class registered under `name` (cheap: no instance is built)."""
    eps = _entry_points()
    if name not in eps:
        refresh()  # installed after the first look?
        eps = _entry_points()
    if name not in eps:
        known = ", ".join(sorted(eps)) or "(none: is the project installed with `pip install -e .`?)"
        raise ValueError(f"unknown environment {name!r}; registered environments: {known}")
    cls = eps[name].load()
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"entry point {name} = {eps[name].value} is not an environments.base.Environment subclass")
    if getattr(cls, "name", None) != name:
        raise ValueError(
            f"entry point {name!r} loads {cls.__qualname__} whose name is {getattr(cls, 'name', None)!r}; "
            "make the entry-point name equal the class's `name`"
        )
    return cls


def get_env(name: str) -> Environment:
    """The (process-wide, shared) instance of environment `name`."""
    with _lock:
        env = _instances.get(name)
    if env is None:
        env = load_env_class(name)()
        with _lock:
            env = _instances.setdefault(name, env)
    return env
