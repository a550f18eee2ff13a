"""One sink for training metrics: JSON Lines file, TensorBoard, optional W&B, and the log line."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from datetime import datetime
from typing import Any

import psutil
import torch

from megatron_fixedcode.arguments.logging_flags import LoggingConfig
from megatron_fixedcode.training.metrics_history import MetricsFile, drop_jsonl_after, drop_tensorboard_after
from megatron_fixedcode.training.run_health import memory_scalars

logger = logging.getLogger(__name__)

_HEALTH_TAGS = {"num_zeros": "num-zeros", "params_norm": "params-norm"}  # record key -> Megatron-LM's tag

# SXM parts report "H100 80GB HBM3" / "H200"; PCIe and NVL boards run at lower clocks and name their form factor.
# Dense peak per GPU by the precision the matmuls run in, for the MFU estimate: BF16 tensor cores
# (bf16 and fp32-autocast-bf16), TF32 tensor cores (FP32 with --tf32), plain FP32 (FP32 otherwise).
_PEAK_FLOPS = {
    "bf16": {
        "H100": 989.4e12,
        "H200": 989.4e12,
        "GH200": 989.4e12,
        "A100": 312e12,
        "B200": 2250e12,
        "H100 PCIe": 756.5e12,
        "H100 NVL": 835.5e12,
        "H200 NVL": 835.5e12,
    },
    "tf32": {
        "H100": 494.7e12,
        "H200": 494.7e12,
        "GH200": 494.7e12,
        "A100": 156e12,
        "B200": 1100e12,
        "H100 PCIe": 378.0e12,
        "H100 NVL": 417.5e12,
        "H200 NVL": 417.5e12,
    },
    "fp32": {
        "H100": 66.9e12,
        "H200": 66.9e12,
        "GH200": 66.9e12,
        "A100": 19.5e12,
        "B200": 80e12,
        "H100 PCIe": 51.2e12,
        "H100 NVL": 60.0e12,
        "H200 NVL": 60.0e12,
    },
}


def matmul_precision(precision: str, tf32: bool) -> str:
    """The peak an MFU is measured against: bf16, tf32 or fp32."""
    return "bf16" if precision in ("bf16", "fp32-autocast-bf16") else "tf32" if tf32 else "fp32"


def require_logging_backends(cfg: LoggingConfig) -> None:
    """Fail before any work when a requested backend is not installed."""
    if cfg.tensorboard_dir:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError as e:
            raise ValueError(
                f"--tensorboard-dir needs the tensorboard package: pip install 'megatron-fixedcode[tb]' ({e})"
            )
    if cfg.wandb_project:
        from megatron_fixedcode.utils.lazy import require

        require("wandb", "wandb", "--wandb-project")


def device_peak_flops(device_name: str, kind: str = "bf16") -> float | None:
    """Dense peak of a GPU by its name (the longest matching model name wins) for ``kind``, else None."""
    table = _PEAK_FLOPS[kind]
    return next((v for k, v in sorted(table.items(), key=lambda kv: -len(kv[0])) if k in device_name), None)


def peak_flops(kind: str = "bf16") -> float | None:
    return device_peak_flops(torch.cuda.get_device_name(), kind) if torch.cuda.is_available() else None


def memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 1024**3
    return psutil.Process().memory_info().rss / 1024**3


def _quiet_tensorboard_disk_errors(args: threading.ExceptHookArgs) -> None:
    """TensorBoard's writer thread prints a traceback when its disk is full, then the next write
    raises the same error in the trainer, which says it in one line."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__module__.startswith("tensorboard"):
        return
    threading.__excepthook__(args)


class MetricsSink:
    """Written on rank 0 only; every rank may call it (others do nothing). The log line is
    Megatron-LM's ``training_log`` line, then this project's fields; TensorBoard and W&B get
    Megatron-LM's tags ('lm loss', 'learning-rate', 'grad-norm', ...) and ours after them."""

    def __init__(
        self,
        cfg: LoggingConfig,
        *,
        enabled: bool,
        max_steps: int,
        flops_per_token: float,
        num_gpus: int,
        run_config: dict[str, Any],
        global_batch: int = 1,
        matmul: str = "bf16",
        code: str = "",
        log_throughput: bool = False,
        wandb_run_id: str | None = None,
        start_step: int | None = None,
    ):
        self.cfg, self.enabled, self.max_steps = cfg, enabled, max_steps
        self.flops_per_token, self.num_gpus = flops_per_token, num_gpus
        self.global_batch, self.matmul, self.code, self.log_throughput = global_batch, matmul, code, log_throughput
        self.metrics_file = self.tensorboard = self.wandb = None
        self._t_last, self._tokens_last, self._steps_last = time.perf_counter(), None, None
        self._losses: list[float] = []
        self._nan_iterations = 0
        if not enabled:
            return
        if start_step is not None:
            self._drop_after(start_step)
        if cfg.metrics_file:
            self.metrics_file = MetricsFile(cfg.metrics_file)
        if cfg.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(cfg.tensorboard_dir)
            threading.excepthook = _quiet_tensorboard_disk_errors  # said once, by _tensorboard_failed
        if cfg.wandb_project:
            import wandb

            # The id is kept with the checkpoint: a requeued job continues the same W&B run.
            self.wandb = wandb.init(
                project=cfg.wandb_project, name=cfg.wandb_exp_name, id=wandb_run_id, config=run_config, resume="allow"
            )

    def _drop_after(self, step: int) -> None:
        """One record per step: a run starting at ``step`` (0 when fresh) drops what an earlier attempt of
        it recorded after that step (metrics_history), and says so in one line when it resumes."""
        lines = drop_jsonl_after(self.cfg.metrics_file, step) if self.cfg.metrics_file else 0
        events = (
            drop_tensorboard_after(self.cfg.tensorboard_dir, step, step * self.global_batch)
            if self.cfg.tensorboard_dir
            else 0
        )
        if step or lines or events:
            logger.info(
                "%s at step %d: dropped %d metrics lines and %d TensorBoard events that an earlier "
                "attempt recorded after it",
                "resumed" if step else "started",
                step,
                lines,
                events,
            )

    def scalars(self, values: dict[str, float], step: int) -> None:
        """TensorBoard (each also ``<tag> vs samples``, as Megatron-LM) and W&B, on rank 0."""
        if self.enabled:
            self._scalars(values, step)

    def _scalars(self, values: dict[str, float], step: int) -> None:
        samples = step * self.global_batch
        if self.tensorboard:
            try:
                for tag, value in values.items():
                    self.tensorboard.add_scalar(tag, value, step)
                    self.tensorboard.add_scalar(f"{tag} vs samples", value, samples)
            except OSError as e:  # a full disk: the run goes on, metrics.jsonl keeps every step
                self._tensorboard_failed(e, step)
        if self.wandb:
            self.wandb.log(values, step=step)

    def _tensorboard_failed(self, error: OSError, step: int | None) -> None:
        logger.warning(
            "TensorBoard logging to %s stops %s (%s); training goes on%s",
            self.cfg.tensorboard_dir,
            f"at step {step}" if step is not None else "at its close",
            error.strerror or error,
            ", metrics.jsonl has every step" if self.metrics_file else "",
        )
        writer, self.tensorboard = self.tensorboard, None
        try:
            writer.close()
        except OSError:
            pass

    def record(self, record: dict[str, Any]) -> None:
        """One optimizer step (and its evaluation, if any)."""
        if not self.enabled:
            return
        if self.metrics_file:
            self.metrics_file.write(record)
        step = record["step"]
        if math.isfinite(record["loss"]):
            self._losses.append(record["loss"])
        else:
            self._nan_iterations += 1
        if step % self.cfg.tensorboard_log_interval == 0:
            self._scalars(
                {
                    "learning-rate": record["lr"],
                    "batch-size": self.global_batch,
                    "lm loss": record["loss"],
                    "loss-scale": 1.0,
                    "grad-norm": record["grad_norm"],
                    "iteration-time": record["step_time_s"],
                    "tokens": record["tokens"],
                    **{tag: record[key] for key, tag in _HEALTH_TAGS.items() if key in record},
                },
                step,
            )
            if self.cfg.log_memory_to_tensorboard:
                self._scalars(memory_scalars(), step)
        if "val_loss" in record:
            self._scalars({"lm loss validation": record["val_loss"], "lm loss validation ppl": record["val_ppl"]}, step)
        if step % self.cfg.log_interval == 0 or step == self.max_steps:
            self._log_line(record)
        if "val_loss" in record:
            bar = "-" * 100
            logger.info(
                "%s\n validation loss at iteration %d | lm loss value: %.6E | lm loss PPL: %.6E | \n%s",
                bar,
                step,
                record["val_loss"],
                record["val_ppl"],
                bar,
            )

    def _log_line(self, record: dict[str, Any]) -> None:
        now = time.perf_counter()
        if self._tokens_last is None:
            self._tokens_last, self._steps_last = record["tokens"] - record["step_tokens"], record["step"] - 1
            self._t_last = now - record["step_time_s"]
        elapsed = max(now - self._t_last, 1e-9)
        steps = max(record["step"] - self._steps_last, 1)
        tokens_per_s = (record["tokens"] - self._tokens_last) / elapsed
        self._t_last, self._tokens_last, self._steps_last = now, record["tokens"], record["step"]
        eta_s = (self.max_steps - record["step"]) * elapsed / steps
        loss = sum(self._losses) / len(self._losses) if self._losses else float("nan")
        tflops = tokens_per_s * self.flops_per_token / self.num_gpus / 1e12
        line = (
            f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}]"
            f" iteration {record['step']:8d}/{self.max_steps:8d} |"
            f" consumed samples: {record['step'] * self.global_batch:12d} |"
            f" elapsed time per iteration (ms): {1000 * elapsed / steps:.1f} |"
        )
        if self.log_throughput:
            line += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
        line += (
            f" learning rate: {record['lr']:.6E} | global batch size: {self.global_batch:5d} |"
            f" lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {record['grad_norm']:.3f} |"
        )
        if "num_zeros" in record:  # Megatron-LM's order: grad norm, num zeros, params norm, skipped, nan
            line += f" num zeros: {record['num_zeros']} |"
        if "params_norm" in record:
            line += f" params norm: {record['params_norm']:.3f} |"
        line += f" number of skipped iterations: {0:3d} | number of nan iterations: {self._nan_iterations:3d} |"
        # this project's fields, after Megatron-LM's
        line += f" tokens/s: {tokens_per_s:,.0f} |"
        peak = peak_flops(self.matmul)
        if peak:
            line += f" TFLOP/s/GPU: {tflops:.1f} | MFU ({self.matmul} peak): {100 * tflops * 1e12 / peak:.1f}% |"
        line += f" mem (GiB): {memory_gib():.2f} | ETA: {_hms(eta_s)} | code: {self.code} |"
        if os.environ.get("MFC_REDUCED_SIZE"):  # a launch on fewer nodes (examples/slurm_relaunch.sh)
            line += f" reduced size: {os.environ['MFC_REDUCED_SIZE']} |"
        self._losses, self._nan_iterations = [], 0
        logger.info("%s", line)
        values = {"tokens-per-sec": tokens_per_s}
        if peak:
            values["mfu"] = tflops * 1e12 / peak
        self._scalars(values, record["step"])

    def close(self) -> None:
        if self.metrics_file:
            self.metrics_file.close()
        if self.tensorboard:
            try:
                self.tensorboard.close()
            except OSError as e:
                self._tensorboard_failed(e, None)
        if self.wandb:
            self.wandb.finish()


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
