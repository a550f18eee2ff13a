"""What this machine offers the GPU path: Python, torch/CUDA, the GPU, megatron-core, Transformer
Engine (and which FP8 recipes it supports here), apex. Writes one JSON object.

    python scripts/gpu_check/env_report.py --out OUT/env.json
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import platform
import sys

FP8_CHECKS = {"delayed": "check_fp8_support", "tensorwise": "check_fp8_support",
              "blockwise": "check_fp8_block_scaling_support", "mxfp8": "check_mxfp8_support"}


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


def collect() -> dict:
    env: dict = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch
    except ImportError as e:
        return {**env, "torch": None, "error": f"torch is not importable: {e}"}
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_count=torch.cuda.device_count(), compute_capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=round(props.total_memory / 2**30, 1))
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
    env["apex"] = importlib.util.find_spec("apex") is not None and importlib.util.find_spec("apex.optimizers") is not None
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
