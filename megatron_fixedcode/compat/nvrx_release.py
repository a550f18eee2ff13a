"""megatron-core 0.19 with nvidia-resiliency-ext 0.4.1 (the only release the package index serves, and
what the ``[ft]`` extra resolves to on both megatron-core lines).

megatron-core 0.19's ``dist_checkpointing/strategies/torch.py`` calls ``has_nvrx_async_support()`` when it
is imported; that function, finding 0.4.1's asynchronous-checkpoint modules, asserts the package is at least
0.6.0 and reads ``nvidia_resiliency_ext.__version__``, which 0.4.1 does not define: every import of
megatron-core's checkpointing then fails (``AttributeError``), so nothing trains. With a release older than
megatron-core's minimum its own answer would be "unsupported" anyway, so the patch gives that answer without
the failing check: megatron-core uses its own asynchronous save, as it does when the package is absent.
Everything else of 0.4.1 (``ft_launcher``, the rank monitors, local checkpoints) is untouched.

Applied from the package's ``__init__`` (before any megatron-core import); no torch, no megatron-core import.
Gated: only where megatron-core has ``strategies/nvrx.py`` with a minimum newer than the installed release.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

NVRX_MODULE = "megatron.core.dist_checkpointing.strategies.nvrx"


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _core_nvrx_file() -> Path | None:
    spec = importlib.util.find_spec("megatron")  # a namespace package: finding it imports nothing of megatron.core
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root) / "core" / "dist_checkpointing" / "strategies" / "nvrx.py"
        if path.is_file():
            return path
    return None


def settle_nvrx_release() -> bool:
    """Register megatron-core's ``strategies/nvrx`` module with ``has_nvrx_async_support`` answering False
    when the installed nvidia-resiliency-ext is older than megatron-core's minimum. True if applied."""
    if NVRX_MODULE in sys.modules:
        return False
    try:
        installed = importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return False
    path = _core_nvrx_file()
    if path is None:
        return False
    minimum = re.search(r'NVRX_MIN_VERSION\s*=\s*"([^"]+)"', path.read_text())
    if minimum is None or _release(installed) >= _release(minimum.group(1)):
        return False
    spec = importlib.util.spec_from_file_location(NVRX_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the file imports only importlib, typing and packaging
    module.has_nvrx_async_support = lambda: False  # older than its minimum: unsupported, said without asserting
    sys.modules[NVRX_MODULE] = module
    return True
