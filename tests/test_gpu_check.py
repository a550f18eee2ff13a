"""scripts/gpu_check.sh on CPU: --help documents its inputs, --dry-run checks its wiring; the
helpers' numbers (FLOPs, MFU), report writers and wheel-requirement scan on fake inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(REPO / "scripts" / "gpu_check"))


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_help_documents_the_inputs():
    out = run(str(SCRIPT), "--help")
    assert out.returncode == 0
    for word in ("--out", "--wheels", "--venv", "--dry-run", "--budget-s", "download_gpu_wheels.sh",
                 "gpu_check.json", "gpu_check.md", "pytest -m gpu", "tokens/s", "MFU", "not_run"):
        assert word in out.stdout, word
    assert run(str(SCRIPT), "--bogus").returncode == 2
    out = run(str(REPO / "scripts" / "download_gpu_wheels.sh"), "--help")
    assert out.returncode == 0 and "--only-binary=:all:" in out.stdout and "transformer_engine_torch" in out.stdout


def test_dry_run_checks_the_wiring(tmp_path):
    out = run(str(SCRIPT), "--dry-run", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    assert "FAILED" not in out.stderr and "dry run ok" in out.stderr
    for f in ("tests/test_te_parity.py", "tests/test_te_flags.py", "tests/test_gpu_te.py"):
        assert f in out.stderr
    report = json.loads((tmp_path / "fake" / "gpu_check.json").read_text())
    assert {b["variant"] for b in report["benchmark"]} == {"learned", "binary"}
    assert "| variant |" in (tmp_path / "fake" / "gpu_check.md").read_text()
    assert "python" in json.loads((tmp_path / "env.json").read_text())


def test_model_flops_leave_out_the_input_table_and_mfu_uses_the_gpu_peak():
    from bench import summarize

    from megatron_fixedcode.models.report import model_flops_per_token as flops_per_token

    learned = {"input_embedding": "learned", "trainable_params": 1_000 + 300, "input_interface_params": 300}
    binary = {"input_embedding": "binary", "trainable_params": 1_000, "input_interface_params": 0}
    assert flops_per_token(learned, 2, 8, 16) == flops_per_token(binary, 2, 8, 16) == 6 * 1_000 + 12 * 2 * 8 * 16
    r = summarize(variant="binary", gpu="NVIDIA H200", step_times=[2.0, 1.0, 3.0], tokens_per_step=1000,
                  flops_tok=1e12, peak_alloc=2**30, peak_reserved=2**31, extra={})
    assert r["step_time_s"] == 2.0 and r["tokens_per_s"] == 500 and r["model_tflops_per_s"] == 500
    assert r["mfu"] == pytest.approx(500 / 989.4) and r["peak_memory_reserved_gib"] == 2
    assert summarize(variant="x", gpu="Some GPU", step_times=[1.0], tokens_per_step=1, flops_tok=1,
                     peak_alloc=0, peak_reserved=0, extra={})["mfu"] is None


def test_report_lists_every_stage_and_missing_inputs(tmp_path):
    import report

    report.add_stage(tmp_path, "tests", "not_run", "0", "needs a CUDA GPU")
    r = report.write(tmp_path)
    md = (tmp_path / "gpu_check.md").read_text()
    assert r["tests"] == {"missing": "pytest-gpu.xml"} and "| tests | not_run | 0.0 | needs a CUDA GPU |" in md
    assert "No benchmark results" in md and "No test results" in md


def test_wheel_requirements_scan(tmp_path):
    from wheel_deps import missing

    def wheel(name: str, version: str, requires: list[str]) -> None:
        with zipfile.ZipFile(tmp_path / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}-{version}.dist-info/METADATA",
                       "Metadata-Version: 2.1\nName: x\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))

    wheel("megatron_core", "0.16.1", ["torch>=2.6.0", "numpy", "packaging>=24.2", 'wandb; extra == "mlm"'])
    wheel("numpy", "2.0.0", [])
    assert missing(tmp_path, "3.12") == ["packaging>=24.2"]  # torch: the machine's; extras: not wanted
