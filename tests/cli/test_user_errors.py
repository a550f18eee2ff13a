"""A user error is one line; ``MFC_TRACEBACK=1`` shows the full traceback above it (for an error
that is our bug, not the user's input). tools/verify_dataset.py reports its progress on long runs."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from megatron_fixedcode.data.verify import Progress
from tests.helpers.data import write_indexed_dataset
from tests.helpers import REPO
from tests.helpers.errors import message_of, refused


def _run(*args: str, traceback: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MFC_TRACEBACK"}
    env.update(PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    if traceback:
        env["MFC_TRACEBACK"] = "1"
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_user_error_is_one_line_and_mfc_traceback_shows_it(tmp_path):
    args = ("tools/verify_dataset.py", "--tokenizer-model", str(tmp_path / "missing"), str(tmp_path / "x"))
    plain = _run(*args)
    assert (
        plain.returncode == 2
        and plain.stderr == f"error: --tokenizer-model: no tokenizer.json at {tmp_path / 'missing'}\n"
    )
    full = _run(*args, traceback=True)
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 2 and lines[0] == "Traceback (most recent call last):", full.stderr
    assert "resolve_tokenizer_json" in full.stderr and lines[-1] == plain.stderr.strip()


@pytest.mark.slow
def test_trainer_error_traceback_on_request(tmp_path):
    args = (
        "-m",
        "megatron_fixedcode.pretrain",
        "--config",
        "examples/recipes/tiny_cpu.yaml",
        "--vocab-size",
        "256",
        "--data-path",
        str(tmp_path / "missing_text_document"),
        "--train-iters",
        "1",
    )
    plain = _run(*args)
    line = refused(plain)
    full = _run(*args, traceback=True)
    assert full.returncode == 2 and "Traceback (most recent call last):" in full.stderr, full.stderr
    assert message_of(line) in full.stderr


def test_progress_lines_are_rate_limited():
    now = [0.0]
    out = io.StringIO()
    progress = Progress(num_shards=4, total_bytes=4000, interval_s=10, stream=out, clock=lambda: now[0])
    for _ in range(4):  # 4 shards of 1000 bytes, 5 s each: a line every 10 s, the first after 10 s
        for _ in range(2):
            now[0] += 2.5
            progress.block(500)
        progress.shard_done(1000)
    assert out.getvalue().splitlines() == [
        "verify: 1/4 shards, 2.0 KB of 4.0 KB (50%), 200 B/s, ETA 00:00:10",
        "verify: 3/4 shards, 4.0 KB of 4.0 KB (100%), 200 B/s, ETA 00:00:00",
    ]
    progress.finish()  # the closing line, since progress was shown
    assert out.getvalue().splitlines()[-1] == "verify: 4/4 shards, 4.0 KB of 4.0 KB (100%), 200 B/s, ETA 00:00:00"


def test_verify_dataset_prints_progress(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(3):
        write_indexed_dataset(tmp_path / f"shard{i}", [rng.integers(0, 100, 50) for _ in range(4)], dtype=np.uint16)
    quiet = _run("tools/verify_dataset.py", str(tmp_path), "--vocab-size", "100")
    assert quiet.returncode == 0 and "verify:" not in quiet.stderr  # a short run: no progress line
    proc = _run("tools/verify_dataset.py", str(tmp_path), "--vocab-size", "100", "--progress-interval", "0")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("verify: ")]
    assert lines[-1].startswith("verify: 3/3 shards,") and "(100%)" in lines[-1] and "ETA 00:00:00" in lines[-1], lines
    assert any(line.startswith("verify: 1/3 shards,") for line in lines)


def test_missing_optional_package_names_its_extra(monkeypatch):
    import pytest

    from megatron_fixedcode.arguments.logging_flags import LoggingConfig
    from megatron_fixedcode.training.metrics import require_logging_backends
    from megatron_fixedcode.utils.lazy import MissingExtra, require

    for module in ("wandb", "matplotlib", "lm_eval", "transformers"):
        monkeypatch.setitem(sys.modules, module, None)  # "import module" raises ImportError
    with pytest.raises(
        ValueError, match=r"--wandb-project needs the wandb package.*pip install 'megatron-fixedcode\[wandb\]'"
    ):
        require_logging_backends(
            LoggingConfig(log_interval=1, tensorboard_dir=None, metrics_file=None, wandb_project="p")
        )
    with pytest.raises(MissingExtra, match=r"pip install 'megatron-fixedcode\[plots\]'"):
        require("matplotlib", "plots", "the report")
    from megatron_fixedcode.eval.run import hf_perplexity

    with pytest.raises(ValueError, match=r"pip install 'megatron-fixedcode\[hf\]'"):
        hf_perplexity(str(REPO / "no-such-export"))
