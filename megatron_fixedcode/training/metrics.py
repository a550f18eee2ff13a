"""One sink for training metrics: JSON Lines file, TensorBoard, optional W&B, and the log line."""
from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from megatron_fixedcode.training.config import LoggingConfig

logger = logging.getLogger(__name__)

# Dense BF16 peak per GPU, for the MFU estimate.
# Dense BF16 peaks (datasheets' sparse figures halved). SXM parts report "H100 80GB HBM3" / "H200";
# the PCIe and NVL boards run at lower clocks and power and report their form factor in the name.
_PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "GH200": 989.4e12, "A100": 312e12, "B200": 2250e12,
                    "H100 PCIe": 756.5e12, "H100 NVL": 835.5e12, "H200 NVL": 835.5e12}


def require_logging_backends(cfg: LoggingConfig) -> None:
    """Fail before any work when a requested backend is not installed."""
    if cfg.tensorboard_dir:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError as e:
            raise ValueError(f"--tensorboard-dir needs the tensorboard package: pip install 'megatron-fixedcode[tb]' ({e})")
    if cfg.wandb_project:
        from megatron_fixedcode._lazy import require

        require("wandb", "wandb", "--wandb-project")


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense BF16 peak of a GPU by its name (the longest matching model name wins), else None."""
    return next((v for k, v in sorted(_PEAK_BF16_FLOPS.items(), key=lambda kv: -len(kv[0])) if k in device_name), None)


def peak_flops() -> float | None:
    return peak_bf16_flops(torch.cuda.get_device_name()) if torch.cuda.is_available() else None


def memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1024**3
    return psutil.Process().memory_info().rss / 1024**3


class MetricsSink:
    """Written on rank 0 only; every rank may call it (others do nothing)."""

    def __init__(self, cfg: LoggingConfig, *, enabled: bool, max_steps: int, flops_per_token: float,
                 num_gpus: int, run_config: dict[str, Any]):
        self.cfg, self.enabled, self.max_steps = cfg, enabled, max_steps
        self.flops_per_token, self.num_gpus = flops_per_token, num_gpus
        self.metrics_file = self.tensorboard = self.wandb = None
        self._t_last, self._tokens_last, self._steps_last = time.perf_counter(), None, None
        if not enabled:
            return
        if cfg.metrics_file:
            Path(cfg.metrics_file).parent.mkdir(parents=True, exist_ok=True)
            self.metrics_file = open(cfg.metrics_file, "a")
        if cfg.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(cfg.tensorboard_dir)
        if cfg.wandb_project:
            import wandb

            self.wandb = wandb.init(project=cfg.wandb_project, config=run_config, resume="allow")

    def record(self, record: dict[str, Any]) -> None:
        """One optimizer step (and its evaluation, if any)."""
        if not self.enabled:
            return
        if self.metrics_file:
            self.metrics_file.write(json.dumps(record) + "\n")
            self.metrics_file.flush()
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                if self.tensorboard:
                    self.tensorboard.add_scalar(f"train/{key}" if not key.startswith("val_") else f"valid/{key}", value, record["step"])
        if self.wandb:
            self.wandb.log(record, step=record["step"])
        if record["step"] % self.cfg.log_interval == 0 or "val_loss" in record or record["step"] == self.max_steps:
            self._log_line(record)

    def _log_line(self, record: dict[str, Any]) -> None:
        now = time.perf_counter()
        if self._tokens_last is None:
            self._tokens_last, self._steps_last = record["tokens"] - record["step_tokens"], record["step"] - 1
            self._t_last = now - record["step_time_s"]
        elapsed = max(now - self._t_last, 1e-9)
        tokens_per_s = (record["tokens"] - self._tokens_last) / elapsed
        steps_per_s = (record["step"] - self._steps_last) / elapsed
        self._t_last, self._tokens_last, self._steps_last = now, record["tokens"], record["step"]
        eta_s = (self.max_steps - record["step"]) / max(steps_per_s, 1e-9)
        parts = [f"step {record['step']}/{self.max_steps}", f"loss {record['loss']:.4f}", f"lr {record['lr']:.3e}",
                 f"grad norm {record['grad_norm']:.3f}", f"{tokens_per_s:,.0f} tokens/s",
                 f"mem {memory_gib():.2f} GiB", f"ETA {_hms(eta_s)}"]
        peak = peak_flops()
        if peak:
            tflops = tokens_per_s * self.flops_per_token / self.num_gpus / 1e12
            parts.insert(5, f"{tflops:.1f} TFLOP/s/GPU MFU {100 * tflops * 1e12 / peak:.1f}%")
        if "val_loss" in record:
            parts.append(f"val loss {record['val_loss']:.4f} ppl {record['val_ppl']:.2f}")
        line = " | ".join(parts)
        if sys.stdout.isatty() and "val_loss" not in record:
            print("\r" + line, end="", flush=True)
        else:
            logger.info(line)
        if self.tensorboard:
            self.tensorboard.add_scalar("train/tokens_per_s", tokens_per_s, record["step"])

    def close(self) -> None:
        if self.metrics_file:
            self.metrics_file.close()
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.finish()


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
