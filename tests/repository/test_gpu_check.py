"""scripts/gpu_check.sh on CPU: --help documents its inputs, --dry-run prints the plan (stages, time
budgets, wheels and their size, both limits checked) and checks its wiring, --cpu-standin runs
every stage's command as the script builds it at toy size (so a typo cannot wait for a GPU); the
helpers' numbers (FLOPs, MFU), report writers, wheel manifest, what the install picks and the
wheel-requirement scan on fake inputs. No network."""

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
    for word in (
        "--out",
        "--wheels",
        "--site",
        "--work",
        "--dry-run",
        "--install-only",
        "--cpu-standin",
        "--budget-s",
        "--bench-layers",
        "download_gpu_wheels.sh",
        "gpu_check.json",
        "gpu_check.md",
        "pytest -m gpu",
        "tokens/s",
        "MFU",
        "989.4",
        "not_run",
        "64 MiB",
        "binary, gf2 and learned",
        "fp32-autocast-bf16",
        "--bf16",
        "distributed optimizer",
        "where TE imports",
        "Transformer Engine cannot travel",
        "--no-bias-swiglu-fusion --no-bias-dropout-fusion",
        "C compiler + Python.h",
        "TORCHINDUCTOR_CACHE_DIR",
        "bit-identical",
        "No venv",
    ):
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


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_checks_the_wiring(tmp_path):
    # no wheels folder (as in CI): the plan still lists them, sized from the committed manifest
    out = run(str(SCRIPT), "--dry-run", "--out", str(tmp_path), "--wheels", str(tmp_path / "no-wheels"))
    assert out.returncode == 0, out.stderr[-4000:]
    assert "FAILED" not in out.stderr and "dry run ok" in out.stderr
    for f in (
        "tests/models/test_te_parity.py",
        "tests/training/test_te_flags.py",
        "tests/models/test_gpu_te.py",
        "tests/training/test_device_contract.py",
    ):
        assert f in out.stderr
    budgets, total, mib = _plan_numbers(out.stdout)
    assert list(budgets) == [
        "env",
        "install",
        "compile",
        "bench:binary",
        "bench:gf2",
        "bench:learned",
        "bench:binary_bf16",
        "ckpt",
        "ckpt:2ranks",
        "tests",
        "bench:te",
        "bench:te_autocast",
        "bench:te_fp8",
        "report",
    ]
    # under 8 minutes (install included) with a margin; the TE stages only run in time left, the 2-rank one on 2 GPUs
    assert sum(b for s, b in budgets.items() if s not in plan.CONDITIONAL) == total <= 480 - 15
    assert budgets["ckpt"] >= 100  # two trainer starts, each writing or reading and hashing ~2.7 GB
    assert "Transformer Engine cannot travel" in out.stdout and "Transformer Engine cannot travel" in out.stderr
    assert "is missing or empty" in out.stdout and "sizes from the manifest wheels.txt" in out.stdout
    manifest = plan.read_manifest()
    assert abs(mib - sum(r["bytes"] for r in manifest) / 2**20) < 0.05 and mib <= 64
    for row in manifest:
        assert row["spec"] in out.stdout
    report = json.loads((tmp_path / "fake" / "gpu_check.json").read_text())
    assert [b["variant"] for b in report["benchmark"]] == ["binary", "gf2", "learned", "binary_bf16"]
    assert report["checkpoint"]["identical_after_load"] and report["compile"]
    assert all(b["placement"]["all_on_cuda"] for b in report["benchmark"])
    assert "| variant |" in (tmp_path / "fake" / "gpu_check.md").read_text()
    env = json.loads((tmp_path / "env.json").read_text())
    assert "python" in env and env["compile"]["ready"] in (True, False) and env["compile"]["reason"]


def test_manifest_pins_megatron_core_0_19_for_python_3_12_and_fits_the_carry():
    specs = {r["spec"].split("==")[0]: r["spec"].split("==")[1] for r in plan.read_manifest()}
    assert specs["megatron-core"].startswith("0.19.")
    # what the trainer imports on a bare CUDA-torch machine; never torch or CUDA runtime packages
    assert {"numpy", "packaging", "pyyaml", "psutil", "pytest", "tokenizers", "sentencepiece"} <= set(specs)
    assert not {n for n in specs if n in ("torch", "triton") or n.startswith("nvidia-")}
    rows = plan.read_manifest()
    assert all(
        r["file"].endswith(".whl") and ("cp312" in r["file"] or "abi3" in r["file"] or "py3-none" in r["file"])
        for r in rows
    )
    assert sum(r["bytes"] for r in rows) <= plan.WHEELS_LIMIT_BYTES


def test_plan_limits_fail_the_dry_run_when_exceeded(tmp_path, monkeypatch, capsys):
    manifest = tmp_path / "wheels.txt"
    manifest.write_text("big==1.0  big-1.0-py3-none-any.whl  70000000\n")
    assert plan.main(["show", "--wheels", str(tmp_path / "none"), "--manifest", str(manifest)]) == 1
    assert "OVER THE LIMIT" in capsys.readouterr().out
    over = plan.TOTAL_LIMIT_S - plan.total_budget() + 1
    monkeypatch.setattr(plan, "STAGES", [*plan.STAGES, ("extra", over, "always", "x")])
    assert plan.main(["show", "--wheels", str(tmp_path / "none")]) == 1
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("time budget total:"))
    assert (
        line.startswith("time budget total: 481 s of at most 480 s (8 min, install included")
        and "OVER THE LIMIT" in line
    )


def test_manifest_round_trip_and_folder_mismatch(tmp_path, capsys):
    wheels = tmp_path / "w"
    wheels.mkdir()
    for name in ("megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl", "numpy-2.0.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"x" * 1000)
    manifest = tmp_path / "wheels.txt"
    rows = plan.write_manifest(wheels, manifest)
    assert (
        [r["spec"] for r in plan.read_manifest(manifest)]
        == [r["spec"] for r in rows]
        == ["megatron-core==0.19.2", "numpy==2.0.0"]
    )
    assert plan.main(["wheels", "--wheels", str(wheels), "--manifest", str(manifest), "--strict"]) == 0
    assert "the folder matches the manifest" in capsys.readouterr().out
    (wheels / "numpy-2.0.0-py3-none-any.whl").rename(wheels / "numpy-2.1.0-py3-none-any.whl")
    assert plan.main(["wheels", "--wheels", str(wheels), "--manifest", str(manifest), "--strict"]) == 1
    assert "differ: numpy==2.0.0 numpy==2.1.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name,tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H200", 989.4),
        ("NVIDIA GH200 480GB", 989.4),  # SXM / Grace Hopper
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200 NVL", 835.5),
        ("Tesla V100", None),
    ],
)
def test_mfu_peak_is_the_exact_devices(name, tflops):
    from megatron_fixedcode.training.metrics import device_peak_flops

    assert device_peak_flops(name) == (None if tflops is None else pytest.approx(tflops * 1e12))


def test_plan_reads_packaging_from_the_wheels_when_python_has_none(tmp_path):
    """The install stage sizes what to install with `packaging`, which it may be about to install."""
    import zipfile

    import packaging

    src = Path(packaging.__file__).parent
    with zipfile.ZipFile(tmp_path / "packaging-99.0-py3-none-any.whl", "w") as z:
        for f in src.rglob("*.py"):
            z.write(f, f"packaging/{f.relative_to(src)}")
    code = (
        "import importlib.util, pathlib, sys; sys.path.insert(0, sys.argv[1]); import plan; "
        "assert importlib.util.find_spec('packaging') is None; print(plan.scan(pathlib.Path(sys.argv[2]))[0]['spec'])"
    )
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code, str(REPO / "scripts" / "gpu_check"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "packaging==99.0", proc.stderr[-2000:]


def test_model_flops_leave_out_the_input_table_and_mfu_uses_the_gpu_peak():
    from bench import summarize

    from megatron_fixedcode.models.cost import model_flops_per_token as flops_per_token

    learned = {"input_embedding": "learned", "trainable_params": 1_000 + 300, "input_interface_params": 300}
    binary = {"input_embedding": "binary", "trainable_params": 1_000, "input_interface_params": 0}
    assert flops_per_token(learned, 2, 8, 16) == flops_per_token(binary, 2, 8, 16) == 6 * 1_000 + 12 * 2 * 8 * 16
    r = summarize(
        variant="binary",
        gpu="NVIDIA H200",
        step_times=[2.0, 1.0, 3.0],
        tokens_per_step=1000,
        flops_tok=1e12,
        peak_alloc=2**30,
        peak_reserved=2**31,
        extra={},
    )
    assert r["step_time_s"] == 2.0 and r["tokens_per_s"] == 500 and r["model_tflops_per_s"] == 500
    assert r["mfu"] == pytest.approx(500 / 989.4) and r["peak_memory_reserved_gib"] == 2
    assert (
        summarize(
            variant="x",
            gpu="Some GPU",
            step_times=[1.0],
            tokens_per_step=1,
            flops_tok=1,
            peak_alloc=0,
            peak_reserved=0,
            extra={},
        )["mfu"]
        is None
    )


def test_report_lists_every_stage_and_missing_inputs(tmp_path):
    import report

    report.add_stage(tmp_path, "tests", "not_run", "0", "needs a CUDA GPU")
    r = report.write(tmp_path)
    md = (tmp_path / "gpu_check.md").read_text()
    assert r["tests"] == {"missing": "pytest-gpu.xml"} and "| tests | not_run | 0.0 | 80 | needs a CUDA GPU |" in md
    assert "No benchmark results" in md and "No test results" in md


def test_wheel_requirements_scan(tmp_path):
    from wheel_deps import missing

    def wheel(name: str, version: str, requires: list[str]) -> None:
        with zipfile.ZipFile(tmp_path / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(
                f"{name}-{version}.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: x\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
            )

    wheel("megatron_core", "0.16.1", ["torch>=2.6.0", "numpy", "packaging>=24.2", 'wandb; extra == "mlm"'])
    wheel("numpy", "2.0.0", [])
    assert missing(tmp_path, "3.12") == ["packaging>=24.2"]  # torch: the machine's; extras: not wanted


def test_install_picks_only_what_this_python_lacks(tmp_path):
    """No wheel over what the machine has and satisfies (its packaging stays); a root it lacks, that
    root's requirements it lacks or has at a version that does not satisfy them; never torch."""
    import importlib.metadata as md

    def wheel(name: str, version: str, requires: list[str]) -> None:
        with zipfile.ZipFile(tmp_path / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(
                f"{name}-{version}.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: x\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
            )

    assert md.version("packaging") and md.version("pytest")
    wheel("fakeroot", "1.0", ["packaging>=1", "torch>=2", "fakedep", 'fakeextra; extra == "dev"'])
    wheel("fakedep", "1.0", ["pytest>=9999"])
    wheel("pytest", "9999.0", [])
    wheel("packaging", "99.0", [])
    wheel("fakeunused", "1.0", [])
    paths, why = plan.missing(tmp_path, roots=["fakeroot", "packaging"])
    assert [p.name for p in paths] == [
        "fakeroot-1.0-py3-none-any.whl",
        "fakedep-1.0-py3-none-any.whl",
        "pytest-9999.0-py3-none-any.whl",
    ]
    assert "not installed" in why[0] and f"installed {md.version('pytest')} does not satisfy pytest>=9999" in why[2]
    assert plan.missing(tmp_path, roots=["packaging", "pytest"]) == ([], [])  # the machine has them: nothing
    with pytest.raises(SystemExit, match="nowheel is needed .* has no wheel of it"):
        plan.missing(tmp_path, roots=["nowheel"])


def test_env_report_says_whether_torch_compile_can_build(monkeypatch, tmp_path):
    import env_report

    monkeypatch.setattr(env_report.shutil, "which", lambda name: None)
    monkeypatch.setattr(env_report.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    r = env_report.compile_readiness()
    assert r == {
        "c_compiler": None,
        "python_h": None,
        "ready": False,
        "reason": f"no C compiler (CC, cc, gcc, clang); no {tmp_path / 'Python.h'}",
    }


@pytest.mark.slow
def test_cpu_standin_runs_every_stage_command(tmp_path):
    """Every stage's command as gpu_check.sh builds it, at toy size on CPU with gloo: the env report,
    the install (no wheels folder: what this python has), the compile warm-up of both precisions at
    once, the four bench variants in the recipe's precision (and --bf16) with the distributed
    optimizer, the checkpoint round trip (bit-identical after the load), pytest -m gpu (skips here),
    the report. Every stage ok, its output kept; the TE ones not run, saying why."""
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHON": sys.executable}
    proc = subprocess.run(
        [
            "bash",
            str(SCRIPT),
            "--cpu-standin",
            "--out",
            str(out),
            "--site",
            str(tmp_path / "site"),
            "--work",
            str(tmp_path / "work"),
            "--wheels",
            str(tmp_path / "no-wheels"),
            "--budget-s",
            "840",
        ],  # toy sizes on a shared CPU: the GPU's 480 s is not the point here
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )  # ckpt:2ranks: two torchruns
    stages = {s["stage"]: s for s in map(json.loads, (out / "stages.jsonl").read_text().splitlines())}
    assert proc.returncode == 0, (proc.stderr[-3000:], stages)
    assert list(stages) == [s for s, _, _, _ in plan.STAGES if s not in (*plan.TE_STAGES, "report")] + [
        *plan.TE_STAGES,
        "report",
    ]
    assert {s: v["status"] for s, v in stages.items()} == {
        **{s: "ok" for s in stages},
        **{s: "not_run" for s in plan.TE_STAGES},
    }
    assert "Transformer Engine cannot travel" in stages["bench:te"]["detail"]
    for variant, precision in (
        ("binary", "fp32-autocast-bf16"),
        ("gf2", "fp32-autocast-bf16"),
        ("learned", "fp32-autocast-bf16"),
        ("binary_bf16", "bf16"),
    ):
        b = json.loads((out / f"bench-{variant}.json").read_text())
        assert b["precision"] == precision and b["timed_steps"] >= 1 and b["compile_fusions"]
        assert "DistributedOptimizer" in b["optimizer"] and b["transformer_impl"] == "local"
        assert (out / f"bench-{variant}.log").read_text().count("trainer flags: --config ") == 1
        assert f"{variant} {precision}: 2 layers" in stages[f"bench:{variant}"]["detail"]
    for variant in ("binary", "binary_bf16"):  # the compile stage: both precisions, each with its own log
        assert json.loads((out / f"compile-{variant}.json").read_text())["warm"]
        assert (out / f"compile-{variant}.log").exists()
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["identical_after_load"] and ckpt["steps_after_load"]["4"]["loaded"]["loss"] > 0
    two = json.loads((out / "ckpt-2ranks.json").read_text())  # gloo here; NCCL where two GPUs are
    assert two["ranks"] == 2 and two["identical_after_load"] and "2 rank(s)" in stages["ckpt:2ranks"]["detail"]
    assert "--save-interval" in (out / "ckpt.log").read_text() and "--ckpt-step" in (out / "ckpt.log").read_text()
    assert (out / "pytest-gpu.xml").exists() and "skipped" in stages["tests"]["detail"]
    assert "nothing installed" in stages["install"]["detail"] or "no wheels" in stages["install"]["detail"]
    for f in ("env.log", "env.json", "install.log", "compile.log", "python-probe.log", "pytest-gpu.log"):
        assert (out / f).stat().st_size > 0, f
    md = (out / "gpu_check.md").read_text()
    assert "bit-identical" in md and "| binary_bf16 | bf16 |" in md and "cannot travel" in md
