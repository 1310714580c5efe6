"""Find environments through the `elr_rl.environments` entry-point group.

A new environment is a module plus one line in pyproject.toml
(`name = "package.module:Class"`), or a separate pip package declaring the
same group: nothing in this project lists environments by hand.

Dataset environments (environments/dataset.py) are declared in configs
instead: an `envs` entry that is a mapping with a `data` key (or the path of a
YAML file holding such mappings). `resolve_envs` registers them in this
process and records every registered spec in the environment variable
ELR_RL_DATASET_ENVS (JSON), which processes started afterwards inherit: the
scoring pool's workers, and Ray actors (elr_rl/rl/ray_env.py forwards it).
Actors that receive a config (profiling workers) resolve its entries
themselves. So a name resolves the same way in every process of a run.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as md
import json
import os
import threading
from pathlib import Path
from typing import Any

from environments.base import Environment

GROUP = "elr_rl.environments"
SPECS_ENV = "ELR_RL_DATASET_ENVS"

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
    """Names of every registered environment (entry points and dataset environments), sorted."""
    return sorted(set(_entry_points()) | set(_dataset_specs()))


@functools.cache
def load_env_class(name: str) -> type[Environment]:
    """Import the class registered under `name` (cheap: no instance is built)."""
    spec = _dataset_specs().get(name)
    if spec is not None:
        from environments.dataset import dataset_class

        return dataset_class(spec)
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


# ---------------------------------------------------------------- dataset environments


def _dataset_specs() -> dict[str, Any]:
    """name -> DatasetSpec of every dataset environment known to this process (its own registrations
    and those inherited through SPECS_ENV)."""
    raw = os.environ.get(SPECS_ENV)
    if not raw:
        return {}
    with _lock:
        cached = _spec_cache.get(raw)
    if cached is None:
        from environments.dataset import DatasetSpec

        cached = {d["name"]: DatasetSpec.from_mapping(d) for d in json.loads(raw)}
        with _lock:
            _spec_cache.clear()
            _spec_cache[raw] = cached
    return cached


_spec_cache: dict[str, dict[str, Any]] = {}


def register_dataset(entry: dict[str, Any]) -> str:
    """Register a dataset environment (a mapping of DatasetSpec fields) in this process and in
    SPECS_ENV for processes started later; returns its name. The same name twice must be the same spec."""
    from environments.dataset import DatasetSpec

    spec = DatasetSpec.from_mapping(dict(entry))
    spec.weight = None  # a property of a pool's mix, not of the environment
    if spec.name in _entry_points():
        raise ValueError(f"dataset environment {spec.name!r} has the name of a registered environment "
                         f"({_entry_points()[spec.name].value}): choose another name")
    specs = {name: s.to_json() for name, s in _dataset_specs().items()}
    if spec.name in specs:
        if specs[spec.name] != spec.to_json():
            raise ValueError(f"dataset environment {spec.name!r} is declared twice with different settings "
                             f"({specs[spec.name]} and {spec.to_json()}): give each its own name")
        return spec.name
    from environments.dataset import dataset_class

    env = dataset_class(spec)()
    env.prompt_keys()  # read and check every row now: a bad file fails before anything starts
    specs[spec.name] = spec.to_json()
    os.environ[SPECS_ENV] = json.dumps(list(specs.values()))
    load_env_class.cache_clear()
    with _lock:
        _instances[spec.name] = env
    return spec.name


def _entries_from_file(path: str) -> list[Any]:
    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    items = loaded if isinstance(loaded, list) else [loaded]
    if not all(isinstance(i, dict) for i in items):
        raise ValueError(f"{path}: a dataset environment file holds one mapping or a list of mappings")
    return items


def source_entries(entries: list[Any]) -> list[dict[str, Any]]:
    """Each `envs` entry as a mapping: a name -> {name}; a .yaml/.yml path -> the mappings it holds."""
    out: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, str) and entry.endswith((".yaml", ".yml")):
            if not Path(entry).is_file():
                raise ValueError(f"envs entry {entry!r} looks like a dataset environment file but does not exist")
            out.extend(_entries_from_file(entry))
        elif isinstance(entry, str):
            out.append({"name": entry})
        elif isinstance(entry, dict):
            out.append(dict(entry))
        else:
            raise ValueError(f"envs entry {entry!r}: use an environment name, a mapping with name and data "
                             "(a dataset environment), or the path of a YAML file of such mappings")
    return out


def resolve_envs(entries: list[Any]) -> list[str]:
    """Environment names of `envs` entries, registering the dataset environments among them.

    A mapping without `data` names a registered environment (optionally with a `weight`).
    Unknown names fail here, before any engine starts.
    """
    names = []
    for entry in source_entries(entries):
        if entry.get("data") is not None:
            names.append(register_dataset(entry))
            continue
        extra = sorted(set(entry) - {"name", "weight"})
        if extra or not isinstance(entry.get("name"), str):
            raise ValueError(f"envs entry {entry}: a registered environment takes only name and weight; "
                             "a dataset environment needs data (a file or folder)")
        load_env_class(entry["name"])
        names.append(entry["name"])
    if len(set(names)) != len(names):
        raise ValueError(f"envs lists an environment twice: {names}")
    return names
