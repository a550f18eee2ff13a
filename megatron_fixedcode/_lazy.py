"""Lazy package exports (PEP 562), so that ``-h`` of a command does not import torch.

A package ``__init__`` names what it exports and the submodule each name lives in; the submodule
is imported on first attribute access. ``from pkg import name`` still works, and so does
``import pkg.sub`` (the ordinary import machinery).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__``/``__dir__`` for *package*: ``exports`` maps a public name to its submodule."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        sub = exports.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
