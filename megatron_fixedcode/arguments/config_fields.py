"""How a typed config is read from the parsed flags: each field is the flag of the same dest, unless its
metadata says otherwise (as Megatron-LM's ``ArgumentGroupFactory`` reads dataclass fields). A ``*_flags.py``
module owns its flags and the dataclass built from them; tests/arguments/test_typed_configs.py checks that
the fields are exactly the module's dests, less what the metadata names."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, TypeVar

C = TypeVar("C")


def renamed(dest: str, convert: Callable[[Any], Any] | None = None, **kwargs) -> Any:
    """A field read from the flag of another dest (``dest``), optionally converted."""
    return dataclasses.field(metadata={"dest": dest, "convert": convert}, **kwargs)


def converted(convert: Callable[[Any], Any], **kwargs) -> Any:
    """A field read from its own flag and converted (a list to a tuple, a signal to its name)."""
    return dataclasses.field(metadata={"convert": convert}, **kwargs)


def borrowed(owner: str, **kwargs) -> Any:
    """A field read from a dest whose flag another module owns (``owner``, for the reader and the test)."""
    return dataclasses.field(metadata={"owner": owner}, **kwargs)


def derived(by: str, **kwargs) -> Any:
    """A field read from a dest that no flag sets: the derivations (``by``) put it in the namespace."""
    return dataclasses.field(metadata={"derived": by}, **kwargs)


def field_dest(field: dataclasses.Field) -> str:
    return field.metadata.get("dest", field.name)


def own_dests(cls: type) -> set[str]:
    """The dests of the flags the config's module must own: every field less the borrowed and derived ones."""
    return {field_dest(f) for f in dataclasses.fields(cls) if "owner" not in f.metadata and "derived" not in f.metadata}


def from_dests(cls: type[C], a: argparse.Namespace) -> C:
    """``cls`` with each field read from its parsed dest (and converted where its metadata says)."""
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(a, field_dest(f))
        convert = f.metadata.get("convert")
        values[f.name] = convert(value) if convert is not None else value
    return cls(**values)
