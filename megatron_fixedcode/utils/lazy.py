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
        try:
            module = importlib.import_module(f"{package}.{sub}")
        except (
            AttributeError
        ) as e:  # else Python's `from pkg import name` reports "cannot import name": the cause hidden
            raise ImportError(
                f"{package}.{sub} (which exports {name}) failed to import: {type(e).__name__}: {e}"
            ) from e
        value = getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


class MissingExtra(ImportError, ValueError):
    """An optional dependency is not installed. A ``ValueError`` too, so that a command prints it as
    one line (a user error: the fix is an install line), naming the extra that brings it."""


def require(module: str, extra: str, needed_for: str) -> Any:
    """``import module``, or :class:`MissingExtra` naming ``pip install 'megatron-fixedcode[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtra(
            f"{needed_for} needs the {module.split('.')[0]} package, which does not import here "
            f"({e}): pip install 'megatron-fixedcode[{extra}]'"
        ) from e
