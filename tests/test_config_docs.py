"""docs/CONFIG.md is generated from the config classes and must stay in sync with them."""

import dataclasses
import importlib

from elr_rl import config_docs


def _classes(cls, seen):
    if cls in seen:
        return
    seen.add(cls)
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            if dataclasses.is_dataclass(value):
                _classes(type(value), seen)


def test_reference_is_up_to_date():
    assert config_docs.OUT.read_text() == config_docs.render(), "run `python -m elr_rl.config_docs`"


def test_every_config_field_is_documented():
    seen: set = set()
    for _, target in config_docs.TOP_LEVEL:
        module, name = target.split(":")
        _classes(getattr(importlib.import_module(module), name), seen)
    def is_section(f):  # a nested config: its class docstring documents it
        return f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory())

    undocumented = [f"{cls.__name__}.{f.name}" for cls in seen for f in dataclasses.fields(cls)
                    if f.name not in config_docs.field_docs(cls) and not is_section(f)]
    assert not undocumented, f"fields without a docstring under them: {undocumented}"
