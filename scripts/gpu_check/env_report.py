"""What this machine offers the GPU path: Python (which one: the check runs the python whose torch
imports), torch/CUDA, the GPU, whether torch.compile can build kernels here (a C compiler and the
Python headers: Triton compiles its launcher with them, and megatron-core's fused SwiGLU and
bias-dropout-add are torch.compile'd), megatron-core, Transformer Engine (and which FP8 recipes it
supports here), apex. Writes one JSON object; gpu_check.sh runs it as a stage (its output kept in
env.log, a timeout recorded as the stage's failure with its reason).

    python scripts/gpu_check/env_report.py --out OUT/env.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import sys
import sysconfig
from pathlib import Path

FP8_CHECKS = {
    "delayed": "check_fp8_support",
    "tensorwise": "check_fp8_support",
    "blockwise": "check_fp8_block_scaling_support",
    "mxfp8": "check_mxfp8_support",
}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fp8_support() -> dict[str, str]:
    """recipe -> 'yes' or 'no: reason' (TE's own checks for this GPU)."""
    out = {}
    for recipe, name in FP8_CHECKS.items():
        check = None
        for module in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
            try:
                check = getattr(importlib.import_module(module), name, None) or check
            except Exception:  # noqa: BLE001 - any import failure means "not available"
                pass
        if check is None:
            out[recipe] = f"no: this Transformer Engine has no {name}()"
            continue
        ok, reason = check()
        out[recipe] = "yes" if ok else f"no: {reason}"
    return out


def compile_readiness() -> dict:
    """Can torch.compile (Triton) build its kernels here? It needs a C compiler ($CC, else cc, gcc or
    clang, as Triton looks) and Python.h of this interpreter."""
    cc = next((p for p in (os.environ.get("CC"), "cc", "gcc", "clang") if p and shutil.which(p)), None)
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = ([] if cc else ["no C compiler (CC, cc, gcc, clang)"]) + ([] if header.exists() else [f"no {header}"])
    return {
        "c_compiler": shutil.which(cc) if cc else None,
        "python_h": str(header) if header.exists() else None,
        "ready": not missing,
        "reason": "; ".join(missing) or "C compiler and Python.h found",
    }


def collect() -> dict:
    env: dict = {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "compile": compile_readiness(),
    }
    try:
        import torch
    except ImportError as e:
        return {**env, "torch": None, "error": f"torch is not importable: {e}"}
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            compute_capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
        )
    env["megatron_core"] = _version("megatron-core")
    env["transformer_engine"] = _version("transformer_engine") or _version("transformer-engine")
    try:
        import transformer_engine.pytorch  # noqa: F401

        env["transformer_engine_importable"] = True
    except Exception as e:  # noqa: BLE001 - report why, whatever it is
        env["transformer_engine_importable"] = False
        env["transformer_engine_error"] = f"{type(e).__name__}: {e}"[:500]
    if env["transformer_engine_importable"] and env.get("cuda_available"):
        env["fp8_support"] = _fp8_support()
    try:
        env["apex"] = (
            importlib.util.find_spec("apex") is not None and importlib.util.find_spec("apex.optimizers") is not None
        )
    except (ImportError, ValueError):  # the unrelated PyPI "apex" may have no optimizers package
        env["apex"] = False
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    env = collect()
    with open(a.out, "w") as f:
        json.dump(env, f, indent=1, sort_keys=True)
    print(json.dumps(env, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
