"""Typed configuration: dataclass schemas merged with OmegaConf.

Precedence: schema defaults < YAML file < command-line `key=value` overrides.
The merged result is validated by the schema's own `validate()` (if it has one)
so a user mistake fails at start-up with a message that says what to change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def load_config(schema: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Build a `schema` instance from defaults, an optional YAML file and dotlist overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = OmegaConf.structured(schema)
    layers = [base]
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"config file {str(p)!r} does not exist: pass the path of a YAML file (see configs/)")
        try:
            loaded = OmegaConf.load(p)
        except Exception as exc:  # yaml's parser errors: say where, without the traceback
            raise ValueError(f"config file {str(p)!r} is not valid YAML: {' '.join(str(exc).split())}") from None
        if not OmegaConf.is_dict(loaded):
            raise ValueError(f"config file {str(p)!r} must hold a mapping of sections (key: value), "
                             f"not a {type(OmegaConf.to_container(loaded)).__name__}")
        layers.append(loaded)
    if overrides:
        bad = [o for o in overrides if "=" not in o]
        if bad:
            raise ValueError(f"overrides must look like key=value, got {bad}")
        layers.append(OmegaConf.from_dotlist(list(overrides)))
    try:
        merged = OmegaConf.merge(*layers)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        # OmegaConf names the offending key; keep its message, drop its traceback.
        raise ValueError(f"invalid configuration: {exc}") from None
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate()
    return cfg  # type: ignore[return-value]


def to_dict(cfg: Any) -> dict:
    """A plain dict of a (nested) dataclass config, for writing into a run directory."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (the run directory's record of what ran)."""
    from omegaconf import OmegaConf

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
