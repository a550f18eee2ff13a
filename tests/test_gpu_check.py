"""scripts/gpu_check.sh on CPU: --help documents its inputs, --dry-run prints the plan (stages, time
budgets, wheels and their size, both limits checked) and checks its wiring; the helpers' numbers
(FLOPs, MFU), report writers, wheel manifest and wheel-requirement scan on fake inputs. No network."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"
sys.path.insert(0, str(REPO / "scripts" / "gpu_check"))
import plan  # noqa: E402


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_help_documents_the_inputs():
    out = run(str(SCRIPT), "--help")
    assert out.returncode == 0
    for word in ("--out", "--wheels", "--venv", "--dry-run", "--install-only", "--budget-s", "download_gpu_wheels.sh",
                 "gpu_check.json", "gpu_check.md", "pytest -m gpu", "tokens/s", "MFU", "not_run", "64 MiB",
                 "binary, gf2 and learned", "where TE imports"):
        assert word in out.stdout, word
    assert run(str(SCRIPT), "--bogus").returncode == 2
    out = run(str(REPO / "scripts" / "download_gpu_wheels.sh"), "--help")
    assert out.returncode == 0 and "--only-binary=:all:" in out.stdout and "transformer_engine_torch" in out.stdout
    assert "0.19.2" in out.stdout and "TE_VERSION" in out.stdout


def _plan_numbers(stdout: str) -> tuple[dict[str, int], int, float]:
    """(stage -> budget s, printed total s, printed wheels MiB) from the dry run's plan."""
    budgets = {m[0]: int(m[1]) for m in re.findall(r"^  (\S+)\s+(\d+) s  ", stdout, flags=re.M)}
    total = int(re.search(r"^time budget total: (\d+) s of at most 480 s", stdout, flags=re.M).group(1))
    mib = float(re.search(r"^wheels total: ([\d.]+) MiB .* of at most 64.0 MiB: ok$", stdout, flags=re.M).group(1))
    return budgets, total, mib


def test_dry_run_prints_the_plan_and_checks_the_wiring(tmp_path):
    # no wheels folder (as in CI): the plan still lists them, sized from the committed manifest
    out = run(str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--wheels", str(tmp_path / "no-wheels"))
    assert out.returncode == 0, out.stderr[-4000:]
    assert "FAILED" not in out.stderr and "dry run ok" in out.stderr
    for f in ("tests/test_te_parity.py", "tests/test_te_flags.py", "tests/test_gpu_te.py"):
        assert f in out.stderr
    budgets, total, mib = _plan_numbers(out.stdout)
    assert list(budgets) == ["env", "install", "tests", "bench:binary", "bench:gf2", "bench:learned", "bench:te",
                             "bench:te_fp8", "report"]
    assert sum(budgets.values()) == total <= 480 - 15  # under 8 minutes with a margin
    assert "is missing or empty" in out.stdout and "sizes from the manifest wheels.txt" in out.stdout
    manifest = plan.read_manifest()
    assert abs(mib - sum(r["bytes"] for r in manifest) / 2**20) < 0.05 and mib <= 64
    for row in manifest:
        assert row["spec"] in out.stdout
    report = json.loads((tmp_path / "fake" / "gpu_check.json").read_text())
    assert {b["variant"] for b in report["benchmark"]} == {"binary", "gf2", "learned"}
    assert all(b["placement"]["all_on_cuda"] for b in report["benchmark"])
    assert "| variant |" in (tmp_path / "fake" / "gpu_check.md").read_text()
    assert "python" in json.loads((tmp_path / "env.json").read_text())
    smoke = json.loads((tmp_path / "smoke-bench.json").read_text())  # the CPU run records where tensors were
    assert smoke["placement"]["parameters"] == {"cpu": sum(smoke["placement"]["parameters"].values())}
    assert smoke["placement"]["batch"] and not smoke["placement"]["all_on_cuda"]


def test_manifest_pins_megatron_core_0_19_for_python_3_12_and_fits_the_carry():
    specs = {r["spec"].split("==")[0]: r["spec"].split("==")[1] for r in plan.read_manifest()}
    assert specs["megatron-core"].startswith("0.19.")
    # what the trainer imports on a bare CUDA-torch machine; never torch or CUDA runtime packages
    assert {"numpy", "packaging", "pyyaml", "psutil", "pytest", "tokenizers", "sentencepiece"} <= set(specs)
    assert not {n for n in specs if n in ("torch", "triton") or n.startswith("nvidia-")}
    rows = plan.read_manifest()
    assert all(r["file"].endswith(".whl") and ("cp312" in r["file"] or "abi3" in r["file"] or "py3-none" in r["file"])
               for r in rows)
    assert sum(r["bytes"] for r in rows) <= plan.WHEELS_LIMIT_BYTES


def test_plan_limits_fail_the_dry_run_when_exceeded(tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "wheels.txt"
    manifest.write_text("big==1.0  big-1.0-py3-none-any.whl  70000000\n")
    assert plan.main(["show", "--wheels", str(tmp_path / "none"), "--manifest", str(manifest)]) == 1
    assert "OVER THE LIMIT" in capsys.readouterr().out
    over = plan.TOTAL_LIMIT_S - plan.total_budget() + 1
    monkeypatch.setattr(plan, "STAGES", [*plan.STAGES, ("extra", over, "always", "x")])
    assert plan.main(["show", "--wheels", str(tmp_path / "none")]) == 1
    assert "time budget total: 481 s of at most 480 s (8 min): OVER THE LIMIT" in capsys.readouterr().out


def test_manifest_round_trip_and_folder_mismatch(tmp_path, capsys):
    wheels = tmp_path / "w"
    wheels.mkdir()
    for name in ("megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl", "numpy-2.0.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"x" * 1000)
    manifest = tmp_path / "wheels.txt"
    rows = plan.write_manifest(wheels, manifest)
    assert [r["spec"] for r in plan.read_manifest(manifest)] == [r["spec"] for r in rows] == [
        "megatron-core==0.19.2", "numpy==2.0.0"]
    assert plan.main(["wheels", "--wheels", str(wheels), "--manifest", str(manifest), "--strict"]) == 0
    assert "the folder matches the manifest" in capsys.readouterr().out
    (wheels / "numpy-2.0.0-py3-none-any.whl").rename(wheels / "numpy-2.1.0-py3-none-any.whl")
    assert plan.main(["wheels", "--wheels", str(wheels), "--manifest", str(manifest), "--strict"]) == 1
    assert "differ: numpy==2.0.0 numpy==2.1.0" in capsys.readouterr().out


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
    assert r["tests"] == {"missing": "pytest-gpu.xml"} and "| tests | not_run | 0.0 | 120 | needs a CUDA GPU |" in md
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
