"""``--hf-export-interval``: the Hugging Face export of a saved checkpoint, in a process of its own on rank 0 while
training goes on (a hand-off of checkpoint/checkpointer.py, which waits for it before the next save, so that pruning
never removes a checkpoint being exported)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

from megatron_fixedcode.errors import ExportFailed
from megatron_fixedcode.utils.job_env import standalone_env

logger = logging.getLogger(__name__)


class HFExport:
    def __init__(self, ck, rank0: bool):
        self.ck, self.rank0 = ck, rank0
        self._running = None  # (process, step, out, log, final)

    def after_save(self, step: int, final: bool) -> None:
        """On rank 0, when due, convert checkpoint ``step`` (complete) in the background."""
        interval = self.ck.hf_export_interval
        if not interval or not self.rank0 or not (final or step % interval == 0):
            return
        out_root = Path(self.ck.hf_export_dir or Path(self.ck.save) / "hf")
        out_root.mkdir(parents=True, exist_ok=True)
        out, log = out_root / f"iter_{step:07d}", out_root / f"iter_{step:07d}.log"
        cmd = [sys.executable, "-m", "megatron_fixedcode.cli.convert_checkpoint_to_hf", "--load", self.ck.save]
        cmd += ["--ckpt-step", str(step), "--output", str(out), "--overwrite"]
        env = standalone_env()  # one process of its own, not a rank of this launch
        # The converter runs on the CPU: on a GPU node it must not allocate a model on the GPU rank 0 trains on.
        env["CUDA_VISIBLE_DEVICES"] = ""
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        self._running = (proc, step, out, log, final)
        logger.info("exporting step %d to Hugging Face format in %s", step, out)

    def wait(self) -> None:
        """Wait for the export running. A failed one leaves no directory under its name (the converter writes
        ``OUT.partial`` and renames it when complete; a killed converter's leftover is removed here). A failed
        intermediate export is logged and training goes on; a failed final export fails the run
        (:class:`ExportFailed`), as it is what the run was asked to deliver. No retry: a full disk or a bad
        tokenizer path would fail again."""
        running, self._running = self._running, None
        if running is None or running[0].wait() == 0:
            return
        from megatron_fixedcode.export import hf_io

        proc, step, out, log, final = running
        shutil.rmtree(hf_io.partial_dir(out), ignore_errors=True)  # nothing holds them: the child has exited
        hf_io.lock_file(out).unlink(missing_ok=True)
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        message = (
            f"the Hugging Face export of step {step} failed ({how}; see {log}): {out} was not written; checkpoint "
            f"step {step} is saved, export it again with tools/convert_checkpoint_to_hf.py --load {self.ck.save} "
            f"--ckpt-step {step} --output {out}"
        )
        if final:
            raise ExportFailed(message)
        logger.error("%s (training goes on)", message)
