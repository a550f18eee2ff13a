"""The one Transformer Engine install hint: the dry run's warning, the model builder's and the
trainer's refusals, and docs/SCALING.md all print this text. Import-light (no torch, no megatron):
the dry run uses it on login nodes."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def supported_te_range(mcore_version: str) -> str:
    """The Transformer Engine releases a megatron-core line is built and tested against
    (its package metadata and CI pins; docs/SCALING.md has the table)."""
    major_minor = tuple(int(x) for x in mcore_version.split(".")[:2])
    return ">=2.16,<2.18" if major_minor >= (0, 19) else ">=2.9,<2.12"


def te_extra(mcore_version: str) -> str:
    """The extra of pyproject.toml that brings the Transformer Engine of a megatron-core line."""
    major_minor = tuple(int(x) for x in mcore_version.split(".")[:2])
    return "te-mcore019" if major_minor >= (0, 19) else "te-mcore016"


def te_install_hint() -> str:
    try:
        mcore_version = version("megatron-core")
    except PackageNotFoundError:
        return (
            "install megatron-core, then Transformer Engine on the CUDA machine: pip install "
            "--no-build-isolation 'transformer_engine[pytorch]' (or use an NGC PyTorch container, which ships it)"
        )
    return (
        "install Transformer Engine on the CUDA machine: pip install --no-build-isolation "
        f"'megatron-fixedcode[{te_extra(mcore_version)}]' or "
        f"'transformer_engine[pytorch]{supported_te_range(mcore_version)}' (the range megatron-core "
        f"{mcore_version} supports; it builds against the installed torch; or use an NGC PyTorch "
        "container, which ships it)"
    )


TE_INSTALL_HINT = te_install_hint()
