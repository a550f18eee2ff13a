"""Megatron-LM's own log checks on this trainer's logs. Megatron-LM's functional tests judge a run by
grepping its log; the rerun family (``gpt3_mcore_reruns_*``, vendored whole under
tests/assets/megatron_lm_reruns/ with its source and licence) is run here with each config's argument
list and judged by each config's ``check_log`` / ``check_log_not`` lines, read from the config itself.

What a CPU run changes in an argument list, and nothing else: the model's shape and the data are the
tiny ones (:data:`CPU_REPLACEMENTS`), the layout is 2 ranks of data parallelism (the reshard case: 1),
the layers are megatron-core's local ones, the paths are the test's. The configs marked ``frozen-start``
resume, as in Megatron-LM's CI, from a checkpoint made beforehand: persistent_2 from persistent_1's
(its rerun checkpoint), resume and reshard from enable's at step 4 (which is why enable also saves there). A run is
8 steps, not 50.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.helpers import ASSETS
from tests.helpers.pretrain import pretrain, write_corpus

pytestmark = pytest.mark.slow

CONFIGS = ASSETS / "megatron_lm_reruns"

# Arguments a CPU run replaces (a value of None drops the flag): the GPU model's shape, its data and tokenizer,
# the layout (TP/PP over 8 GPUs), Transformer Engine.
CPU_REPLACEMENTS: dict[str, str | None] = {
    "--num-layers": "2",
    "--hidden-size": "64",
    "--ffn-hidden-size": "128",
    "--num-attention-heads": "4",
    "--num-query-groups": "2",
    "--kv-channels": "16",
    "--seq-length": "32",
    "--max-position-embeddings": "32",
    "--tensor-model-parallel-size": "1",
    "--pipeline-model-parallel-size": "1",
    "--sequence-parallel": None,  # TP 1: Megatron-LM turns it off itself
    "--transformer-impl": "local",
    "--data-path": None,  # the test's corpus and vocabulary, below
    "--vocab-file": None,
    "--merge-file": None,
    "--data-cache-path": None,
    "--split": "99,1,0",
    "--train-iters": "8",  # of 50: minutes of CPU each; every check is decided in the first steps
    "--global-batch-size": "32",  # of 128 (16 microbatches per rank): the injected faults still come by step 3
}

# Checks that Megatron-LM's own current code cannot satisfy: not faked, listed with the reason.
STALE = {
    (
        "persistent_2",
        r"ERROR:megatron\.core\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\-)+, device [0-9]+: "
        "Possible persistent error!!",
    ): "megatron-core logs 'Rank R, node N, device D, iteration #I: Possible persistent error!!' "
    "(rerun_state_machine.log_failure): the regex wants ': Possible' right after the device",
    (
        "transient",
        r"ERROR:megatron\.core\.rerun_state_machine:Rank [0-9]+, node ([0-9a-z]|\-)+, device [0-9]+: "
        "Possible transient error!!",
    ): "as persistent_2's: megatron-core's line has ', iteration #I' before ': Possible transient error!!'",
    (
        "disable",
        "Setting rerun_state_machine.current_iteration to 0...",
    ): "no Megatron-LM code prints it: added by commit 4dc6b7157a, removed by ebcd1d9cdf ('Enable reruns by "
    "default'), the commit that added this check",
}


def read_config(name: str) -> tuple[list[str], list[tuple[bool, str, str]]]:
    """A config's argument list (``true``: the flag alone) and its checks: (must match, grep option, pattern)."""
    cfg = yaml.safe_load((CONFIGS / name / "model_config.yaml").read_text())
    args = []
    for flag, value in cfg["MODEL_ARGS"].items():
        args += [flag] if value is True else [flag, str(value)]
    checks = []
    for line in cfg["AFTER_SCRIPT"].splitlines():
        words = shlex.split(line)
        if words and words[0] in ("check_log", "check_log_not"):
            checks.append((words[0] == "check_log", words[1], words[2]))
    return args, checks


def cpu_args(args: list[str], **extra: str | None) -> list[str]:
    """``args`` with :data:`CPU_REPLACEMENTS` and ``extra`` applied (flags not yet there are appended)."""
    replace = {**CPU_REPLACEMENTS, **extra}
    out, i = [], 0
    while i < len(args):
        flag, takes_value = args[i], i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag in replace:
            value = replace.pop(flag)
            if value is not None:
                out += [flag, value] if takes_value else [flag]
        else:
            out += args[i : i + 1 + takes_value]
        i += 1 + takes_value
    for flag, value in replace.items():
        if value is not None:
            out += [flag] if value == "" else [flag, value]
    return out


def grep(option: str, pattern: str, log: str) -> bool:
    """``grep -F`` / ``grep -E`` over the log's lines."""
    if option == "-F":
        return any(pattern in line for line in log.splitlines())
    assert option == "-E", option
    return any(re.search(pattern, line) for line in log.splitlines())


def failed_checks(name: str, log: str) -> list[str]:
    _, checks = read_config(name)
    failed = []
    for must, option, pattern in checks:
        if (name, pattern) in STALE:
            assert not grep(option, pattern, log), f"{name}: a check listed as stale passes: {pattern}"
            continue
        if grep(option, pattern, log) != must:
            failed.append(f"{'check_log' if must else 'check_log_not'} {option} {pattern!r}")
    return failed


def run(name: str, tmp: Path, corpus: tuple[str, str], nproc: int = 2, **extra: str | None):
    args, _ = read_config(name)
    paths = {"--save": str(tmp / name / "ckpt"), "--tensorboard-dir": str(tmp / name / "tb")}
    paths["--load"] = extra.pop("load", None) or paths["--save"]
    data = {"--data-path": corpus[0], "--vocab-size": "1024", "--make-vocab-size-divisible-by": "8"}
    proc = pretrain(*cpu_args(args, **paths, **data, **extra), nproc=nproc, check=False, torchrun=True, base=[])
    log = proc.stdout + proc.stderr
    ranks = set(re.findall(r"exitcode\s*: (\d+)", log))  # torchrun exits 1 for any failed rank; its report says
    return (int(ranks.pop()) if len(ranks) == 1 else proc.returncode), log


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each config's exit code and log, in the order their checkpoints need."""
    tmp = tmp_path_factory.mktemp("reruns")
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"))
    out = {"enable": run("enable", tmp, corpus, **{"--save-interval": "4"})}
    out["disable"] = run("disable", tmp, corpus)
    out["persistent_1"] = run("persistent_1", tmp, corpus)
    out["persistent_2"] = run("persistent_2", tmp, corpus, load=str(tmp / "persistent_1" / "ckpt"))
    out["transient"] = run("transient", tmp, corpus)
    enable_4 = {"load": str(tmp / "enable" / "ckpt"), "--ckpt-step": "4"}
    out["resume"] = run("resume", tmp, corpus, **enable_4)
    out["reshard"] = run("reshard", tmp, corpus, nproc=1, **enable_4)
    return out


def test_the_vendored_configs_are_the_rerun_family_with_checks():
    names = sorted(p.name for p in CONFIGS.iterdir() if p.is_dir())
    assert names == ["disable", "enable", "persistent_1", "persistent_2", "reshard", "resume", "transient"]
    for name in names:
        args, checks = read_config(name)
        assert "--rerun-mode" in args and checks, name
    assert all((name, pattern) in {(n, p) for n in names for *_, p in read_config(n)[1]} for name, pattern in STALE)


def test_cpu_args_replace_the_gpu_model_data_and_layout_and_keep_the_rest():
    args, _ = read_config("transient")
    out = cpu_args(args, **{"--save": "/s", "--vocab-size": "1024"})
    assert out[out.index("--num-layers") + 1] == "2" and out[out.index("--transformer-impl") + 1] == "local"
    assert "--sequence-parallel" not in out and "--merge-file" not in out and "--data-path" not in out
    for kept in ("--rerun-mode", "--error-injection-type", "--async-save", "--use-persistent-ckpt-worker"):
        assert kept in out
    assert out[out.index("--exit-interval") + 1] == "4" and out[out.index("--save") + 1] == "/s"
    assert out[-2:] == ["--vocab-size", "1024"]


@pytest.mark.parametrize(
    "name", ["enable", "disable", "persistent_1", "persistent_2", "transient", "resume", "reshard"]
)
def test_megatron_lms_log_checks_pass(runs, name):
    code, log = runs[name]
    assert failed_checks(name, log) == [], f"exit {code}\n{log[-6000:]}"


def test_the_runs_end_as_megatron_lms_do(runs):
    """The exit codes: 16 after a reproducible fault (a checkpoint, resume elsewhere), again when resumed
    on the same GPU; 17 after a fault that a re-run did not reproduce (a checkpoint)."""
    codes = {name: code for name, (code, _) in runs.items()}
    assert codes == {
        "enable": 0,
        "disable": 0,
        "persistent_1": 16,
        "persistent_2": 16,
        "transient": 17,
        "resume": 0,
        "reshard": 0,
    }, {n: log[-3000:] for n, (c, log) in runs.items() if c != 0}
