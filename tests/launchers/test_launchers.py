"""Slurm launchers and YAML recipes: syntax, dry runs the trainer accepts, recipe invariants,
and how the launchers read their environment. Under a real Slurm controller: tests/launchers/test_slurm.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.launchers import launcher_env, run_dry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RECIPES = EXAMPLES / "recipes"
INPUT_KEYS = re.compile(r"^(input_embedding|code_\w+)$")
# what the launchers set on the command line, on top of the recipe
LAUNCHER_KEYS = {
    "data_path",
    "train_data_path",
    "valid_data_path",
    "tokenizer_model",
    "seed",
    "save",
    "load",
    "save_interval",
    "exit_signal_handler",
    "tensorboard_dir",
    "metrics_file",
}

# (script, positional args, recipe)
LAUNCHERS = [
    ("pretrain_1p7b_fixedcode.sh", [], "paper2_1p7b_binary.yaml"),
    ("pretrain_1p7b_gf2.sh", [], "paper2_1p7b_gf2.yaml"),
    ("pretrain_1p7b_learned.sh", [], "paper2_1p7b_learned.yaml"),
    ("pretrain_paper1.sh", ["gf2"], "paper1_0p4b_gf2.yaml"),
    ("pretrain_paper1.sh", ["learned", "9"], "paper1_0p4b_learned_L9.yaml"),
]


def recipe(name: str) -> dict:
    return yaml.safe_load((RECIPES / name).read_text())


def trainer_args(command: list[str]) -> list[str]:
    return command[command.index("megatron_fixedcode.pretrain") + 1 :]


def test_all_shell_scripts_parse():
    scripts = sorted(EXAMPLES.glob("*.sh")) + sorted((ROOT / "scripts").glob("*.sh"))
    assert len(scripts) >= 6
    for script in scripts:
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, f"{script}: {out.stderr}"


@pytest.mark.parametrize("script", sorted({s for s, _, _ in LAUNCHERS}))
def test_sbatch_header(script):
    text = (EXAMPLES / script).read_text()
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", text, flags=re.M))
    for key in ("nodes", "gpus-per-node", "ntasks-per-node", "time", "signal", "requeue", "no-kill", "output"):
        assert key in sbatch, f"{script}: no #SBATCH --{key}"
    assert sbatch["gpus-per-node"] == "8" and sbatch["ntasks-per-node"] == "1"
    assert sbatch["signal"] == "B:USR1@300"
    assert "%j" in sbatch["output"]
    # the dry run outside Slurm uses the same node count as the allocation
    assert re.search(rf"^DEFAULT_NODES={sbatch['nodes']}$", text, flags=re.M)
    # SBATCH lines are only read before the first command
    first_command = re.search(r"^[^#\n]", text, flags=re.M).start()
    assert text.rfind("#SBATCH") < first_command


def test_a_relaunch_runs_the_same_command_on_the_nodes_left_with_a_rendezvous_of_its_own():
    """slurm_relaunch.sh: srun's node count and list, the elastic launcher's node count, a new rendezvous (host,
    port, id); the trainer's flags untouched, whatever they hold."""
    launch = (
        "srun --nodes 3 --ntasks-per-node 1 bash slurm_node.sh torchrun --nnodes 3 --nproc_per_node 8 "
        "--rdzv_backend c10d --rdzv_endpoint mfc-node1:20042 --rdzv_id 42 --max-restarts 3 "
        "-m megatron_fixedcode.pretrain --config r.yaml --nodes x --rdzv_id y"
    )
    script = (
        f"source {EXAMPLES / 'slurm_relaunch.sh'}; MFC_RELAUNCHES=2 MFC_RELAUNCH_COUNT=2 "
        "MFC_RELAUNCH_NODES=mfc-node1,mfc-node3 MFC_RENDEZVOUS_HOST=mfc-node1; "
        f'mfc_relaunch_command {launch}; printf "%s\\n" "${{MFC_LAUNCH[@]}}"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    assert " ".join(out) == (
        "srun --nodes 2 --ntasks 2 --nodelist mfc-node1,mfc-node3 --ntasks-per-node 1 bash slurm_node.sh torchrun --nnodes 2 "
        "--nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint mfc-node1:20044 --rdzv_id 42.2 --max-restarts 3 "
        "-m megatron_fixedcode.pretrain --config r.yaml --nodes x --rdzv_id y"
    )


def elastic_index(command: list[str]) -> int:
    """Where the elastic launcher starts in the launch command."""
    return next(i for i, a in enumerate(command) if a in ("torchrun", "ft_launcher"))


def test_the_elastic_launcher_is_ft_launcher_where_installed_else_torchrun(tmp_path):
    """ELASTIC_LAUNCHER chooses; without it, ft_launcher if nvidia-resiliency-ext imports; MAX_RESTARTS is checked."""
    for chosen in ("torchrun", "ft_launcher"):
        command, _, _ = run_dry("pretrain_1p7b_fixedcode.sh", [], launcher_env(tmp_path, ELASTIC_LAUNCHER=chosen))
        assert command[elastic_index(command)] == chosen
    command, _, _ = run_dry("pretrain_1p7b_fixedcode.sh", [], launcher_env(tmp_path, MAX_RESTARTS="0"))
    assert command[command.index("--max-restarts") + 1] == "0"
    installed = importlib.util.find_spec("nvidia_resiliency_ext") is not None
    command, _, _ = run_dry("pretrain_1p7b_fixedcode.sh", [], launcher_env(tmp_path))
    assert command[elastic_index(command)] == ("ft_launcher" if installed else "torchrun")
    bad = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_1p7b_fixedcode.sh"), "--dry-run"],
        env=launcher_env(tmp_path, MAX_RESTARTS="two"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == (
        "error: MAX_RESTARTS=two: give a whole number (0: no in-job restart)"
    )


@pytest.mark.parametrize("script,args,recipe_name", LAUNCHERS, ids=[f"{s}:{'-'.join(a)}" for s, a, _ in LAUNCHERS])
def test_dry_run_command_is_accepted_by_the_trainer(tmp_path, monkeypatch, capsys, script, args, recipe_name):
    from megatron_fixedcode.pretrain import main

    env = launcher_env(tmp_path)
    if recipe_name.startswith("paper1"):  # paper 1 expands ${FINEWEB_PREFIX}/${COSMOPEDIA_PREFIX} in its recipe
        del env["DATA_PATH"], env["VALID_DATA_PATH"]
    command, printed, stderr = run_dry(script, args, env)
    assert "would be refused" not in stderr, stderr
    assert command[:1] == ["srun"]
    torchrun = command[elastic_index(command) :]  # ft_launcher (nvidia-resiliency-ext installed) or torchrun
    for flag in ("--nnodes", "--nproc_per_node", "--rdzv_backend", "--rdzv_endpoint", "--rdzv_id", "--max-restarts"):
        assert flag in torchrun
    assert torchrun[torchrun.index("--rdzv_backend") + 1] == "c10d"
    assert torchrun[torchrun.index("--nproc_per_node") + 1] == "8"
    assert torchrun[torchrun.index("--max-restarts") + 1] == "3"  # MAX_RESTARTS' default
    # srun gives the node's one task its CPUs (srun does not inherit sbatch's --cpus-per-task)
    srun = command[: elastic_index(command)]
    cpus = [a for a in srun if a.startswith("--cpus-per-task=")]
    assert len(cpus) == 1 and int(cpus[0].split("=")[1]) >= 1

    # the trainer's own parser, in this process, with the launcher's environment
    for key in ("FINEWEB_PREFIX", "COSMOPEDIA_PREFIX", "DATA_PATH", "VALID_DATA_PATH", "TOKENIZER"):
        monkeypatch.delenv(key, raising=False)
        if key in env:
            monkeypatch.setenv(key, env[key])
    monkeypatch.setenv(
        "WORLD_SIZE", str(int(torchrun[torchrun.index("--nnodes") + 1]) * 8)
    )  # as the launcher's dry run
    capsys.readouterr()
    assert main([*trainer_args(command), "--dry-run"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved == printed
    for key, value in recipe(recipe_name).items():
        if key not in LAUNCHER_KEYS:
            assert resolved[key] == value, key
    assert resolved["save"] == resolved["load"] == env["CKPT_DIR"]
    assert resolved["exit_signal_handler"] is True
    assert resolved["metrics_file"].startswith(env["LOG_DIR"])
    if recipe_name.startswith("paper2"):
        assert resolved["train_data_path"] == env["DATA_PATH"].split()
        assert resolved["tokenizer_model"] == env["TOKENIZER"]
        assert resolved["global_batch_size"] * resolved["seq_length"] == 262_144
    else:
        assert resolved["train_data_path"] == [
            "0.8",
            "/data/fineweb_train_text_document",
            "0.2",
            "/data/cosmopedia_train_text_document",
        ]


def test_dry_run_cpus_per_task_and_cuda_requirement(tmp_path):
    env = launcher_env(tmp_path, SLURM_CPUS_PER_TASK="64", SLURM_GPUS_ON_NODE="8")
    del env["MFC_REQUIRE_CUDA"]
    env.pop("OMP_NUM_THREADS", None)  # a user's own setting wins over the per-GPU default checked below
    out = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_1p7b_fixedcode.sh"), "--dry-run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    command = shlex.split(lines[lines.index("# command:") + 1])
    assert "--cpus-per-task=64" in command[: elastic_index(command)]
    assert "cpus_per_task=64" in lines[0]
    # the trainer's environment: a rank without a visible GPU refuses to start (exported by default)
    assert "MFC_REQUIRE_CUDA=1" in out.stdout and "OMP_NUM_THREADS=8" in out.stdout
    env.update(CPUS_PER_TASK="32", MFC_REQUIRE_CUDA="0")
    command, _, _ = run_dry("pretrain_1p7b_fixedcode.sh", [], env)
    assert "--cpus-per-task=32" in command
    text = (EXAMPLES / "slurm_common.sh").read_text()
    assert "MFC_REQUIRE_CUDA" in text.split("mfc_log()")[0]  # documented in the header


@pytest.mark.slow
def test_dry_run_extra_flags_override_the_recipe_and_node_count_keeps_global_batch(tmp_path):
    env = launcher_env(tmp_path, SLURM_NNODES="1", SEED="7")
    command, config, stderr = run_dry("pretrain_1p7b_learned.sh", ["--log-interval", "1"], env)
    assert command[command.index("--nnodes") + 1] == "1"
    assert config["log_interval"] == 1 and config["seed"] == 7
    assert config["global_batch_size"] == 128 and "would be refused" not in stderr
    assert config["tensorboard_dir"] is None
    # 4 nodes x 8 GPUs x micro batch 8 > 128: refused with the reason
    _, _, stderr = run_dry("pretrain_1p7b_learned.sh", [], launcher_env(tmp_path, SLURM_NNODES="4"))
    assert "would be refused" in stderr and "data-parallel size 32" in stderr
    # where a relaunch on fewer nodes keeps the global batch (recovery/node_plan.py), down to MIN_NODES
    lines = dry_run_lines("pretrain_1p7b_learned.sh", launcher_env(tmp_path, SLURM_NNODES="4"))
    assert (
        "# node counts that keep global batch 128: 2 (dp 16, 1 microbatch per rank), 1 (dp 8, 2 microbatches per rank)"
        in lines
    )
    lines = dry_run_lines("pretrain_1p7b_learned.sh", launcher_env(tmp_path, SLURM_NNODES="4", MIN_NODES="2"))
    assert "# node counts that keep global batch 128: 2 (dp 16, 1 microbatch per rank)" in lines
    assert "MIN_NODES" in (EXAMPLES / "slurm_common.sh").read_text().split("mfc_log()")[0]  # documented in the header
    # TensorBoard by default, under LOG_DIR
    env = launcher_env(tmp_path)
    del env["TENSORBOARD_DIR"]
    _, config, _ = run_dry("pretrain_1p7b_learned.sh", [], env)
    assert config["tensorboard_dir"] == str(tmp_path / "logs" / "tensorboard")


def dry_run_lines(script: str, env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        ["bash", str(EXAMPLES / script), "--dry-run"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_paper1_launcher_rejects_unknown_recipe(tmp_path):
    out = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_paper1.sh"), "gf2", "9", "--dry-run"],
        env=launcher_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "paper1_0p4b_gf2_L9.yaml not found" in out.stderr


def _only_input_keys_differ(a: dict, b: dict, also: frozenset = frozenset()) -> set:
    keys = set(a) | set(b)
    return {k for k in keys if a.get(k, None) != b.get(k, None) and not INPUT_KEYS.match(k) and k not in also}


def test_paper2_recipes_differ_only_in_input_keys():
    learned, binary, gf2 = (recipe(f"paper2_1p7b_{v}.yaml") for v in ("learned", "binary", "gf2"))
    assert (learned["input_embedding"], binary["input_embedding"], gf2["input_embedding"]) == (
        "learned",
        "binary",
        "gf2",
    )
    assert gf2["code_seed"] == 12345 and gf2.get("code_offset", 0) == 0
    for a, b in ((learned, binary), (learned, gf2), (binary, gf2)):
        assert _only_input_keys_differ(a, b) == set()


def test_paper1_recipes_differ_only_in_input_keys_and_depth():
    names = sorted(p.name for p in RECIPES.glob("paper1_0p4b_*.yaml"))
    assert {
        "paper1_0p4b_learned.yaml",
        "paper1_0p4b_binary.yaml",
        "paper1_0p4b_gf2.yaml",
        "paper1_0p4b_learned_L9.yaml",
        "paper1_0p4b_binary_L9.yaml",
        "paper1_0p4b_learned_L16.yaml",
        "paper1_0p4b_binary_L16.yaml",
    } <= set(names)
    base = recipe("paper1_0p4b_learned.yaml")
    for name in names:
        r = recipe(name)
        budget = frozenset({"train_tokens"}) if "_gf2" in name else frozenset()  # same schedule, earlier stop
        assert _only_input_keys_differ(base, r, frozenset({"num_layers"}) | budget) == set(), name
        layers = re.search(r"_L(\d+)\.yaml$", name)
        assert r["num_layers"] == (int(layers.group(1)) if layers else 32)


def test_recipes_hold_the_spec_numbers():
    p2 = recipe("paper2_1p7b_binary.yaml")
    expected2 = dict(
        num_layers=24,
        hidden_size=2048,
        num_attention_heads=32,
        ffn_hidden_size=8192,
        seq_length=2048,
        normalization="RMSNorm",
        swiglu=True,
        add_bias_linear=False,
        position_embedding_type="rope",
        untie_embeddings_and_output_weights=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        lr=1.5e-4,
        min_lr=1e-5,
        lr_warmup_iters=2000,
        lr_decay_style="cosine",
        lr_decay_iters=382_500,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        weight_decay=0.01,
        clip_grad=1.0,
        precision="fp32-autocast-bf16",
        recompute_granularity=None,
        transformer_impl="transformer_engine",
        micro_batch_size=8,
        global_batch_size=128,
        train_tokens=100_000_000_000,
        dataset_type="document_windows",
        samples_per_shard_visit=1024 * 8 * 2,
        tokenizer_type="HuggingFaceTokenizer",
        vocab_size=49152,
    )
    assert {k: p2[k] for k in expected2} == expected2
    assert isinstance(p2["train_tokens"], int)
    p1 = recipe("paper1_0p4b_binary.yaml")
    expected1 = dict(
        num_layers=32,
        hidden_size=1024,
        num_attention_heads=32,
        ffn_hidden_size=4096,
        seq_length=1024,
        normalization="LayerNorm",
        swiglu=False,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        weight_decay=0.1,
        clip_grad=1.0,
        lr_decay_style="cosine",
        vocab_size=65536,
        transformer_impl="local",
        recompute_granularity="selective",
    )
    assert {k: p1[k] for k in expected1} == expected1
    assert not p1.get("bf16", False) and p1["lr_warmup_iters"] > 0
    assert p1["train_tokens"] == 17_093_000_000  # paper 1's learned and fixed budget
    affine = recipe("paper1_0p4b_gf2.yaml")  # paper 1's figure for its affine runs
    assert affine["train_tokens"] == 16_276_000_000
    assert p1["train_data_path"][0::2] == [0.8, 0.2]
    tiny = recipe("tiny_cpu.yaml")
    expected_tiny = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=64,
        micro_batch_size=4,
        global_batch_size=8,
        transformer_impl="local",
        lr=3e-3,
        train_iters=50,
        log_interval=5,
        eval_interval=25,
        eval_iters=2,
    )
    assert {k: tiny[k] for k in expected_tiny} == expected_tiny and not tiny.get("bf16", False)


def test_paper1_resolved_configs_are_fp32_without_tf32_and_hold_the_papers_budgets(capsys):
    """Paper 1 trained in FP32 (TF32 off); learned/fixed train 17.093B targets, the affine run stops at
    16.276B on the others' (unshortened) cosine. Steps are the trainer's own rounding of the budget."""
    import argparse

    from megatron_fixedcode.pretrain import main
    from megatron_fixedcode.arguments.schedule_flags import ScheduleConfig

    def resolved(name: str, *flags: str) -> tuple[dict, int]:
        capsys.readouterr()
        assert main(["--config", str(RECIPES / name), *flags, "--dry-run"]) == 0
        config = json.loads(capsys.readouterr().out)
        steps = ScheduleConfig.from_args(argparse.Namespace(**config)).max_steps(config["global_batch_size"])
        return config, steps

    names = sorted(p.name for p in RECIPES.glob("paper1_0p4b_*.yaml"))
    assert len(names) == 7
    for name in names:
        config, steps = resolved(name)
        assert config["tf32"] is False and config["precision"] == "fp32", name
        per_step = config["global_batch_size"] * config["seq_length"]
        assert config["lr_decay_iters"] == 65_205, name  # one schedule for every paper-1 run
        if "_gf2" in name:
            assert config["train_tokens"] == 16_276_000_000
            assert steps == 62_089 and (steps - 1) * per_step < 16_276_000_000 <= steps * per_step
            assert steps < config["lr_decay_iters"]  # stopped before the cosine ends, as the paper's run
        else:
            assert config["train_tokens"] == 17_093_000_000
            assert steps == config["lr_decay_iters"] == 65_205
            assert (steps - 1) * per_step < 17_093_000_000 <= steps * per_step == 17_093_099_520
    # the shortened schedule (ours) is one flag away and still stops at the same step
    config, steps = resolved("paper1_0p4b_gf2.yaml", "--lr-decay-iters", "62089")
    assert config["lr_decay_iters"] == steps == 62_089


def test_every_recipe_passes_the_trainer_dry_run(capsys, tmp_path):
    from megatron_fixedcode.pretrain import main
    from megatron_fixedcode.replication.study import PLANS

    study = {plan.recipe.name: plan for plan in PLANS.values()}
    for path in sorted(RECIPES.glob("*.yaml")):
        argv = ["--config", str(path)]
        if path.name in study:  # the study runner adds the variant, the budget and the checkpoint directory
            argv = [*study[path.name].trainer_flags(study[path.name].runs[0]), "--save", str(tmp_path)]
        assert main([*argv, "--dry-run"]) == 0, path.name
        assert json.loads(capsys.readouterr().out)["num_layers"] == recipe(path.name)["num_layers"]


def test_list_variables_split_on_any_whitespace_and_are_counted(tmp_path):
    """DATA_PATH as the launchers' headers build it (`ls ... | sed`: one prefix per line) passes every prefix."""
    env = launcher_env(
        tmp_path,
        DATA_PATH="/fwe/000_train_text_document\n/fwe/001_train_text_document\n/fwe/002_train_text_document\n",
        VALID_DATA_PATH="0.5 /v/a_text_document\t0.5\n/v/b_text_document",
    )
    out = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_1p7b_fixedcode.sh"), "--dry-run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "# paths passed: DATA_PATH=3 VALID_DATA_PATH=2" in out.stdout.splitlines()
    config = json.loads(out.stdout.splitlines()[out.stdout.splitlines().index("# resolved config:") + 1])
    assert config["train_data_path"] == [f"/fwe/00{i}_train_text_document" for i in range(3)]
    assert config["valid_data_path"] == ["0.5", "/v/a_text_document", "0.5", "/v/b_text_document"]


@pytest.mark.parametrize("var", ["DATA_PATH", "VALID_DATA_PATH", "DATA_MANIFEST"])
def test_a_list_variable_that_is_set_but_empty_is_refused(tmp_path, var):
    out = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_1p7b_fixedcode.sh"), "--dry-run"],
        env=launcher_env(tmp_path, **{var: " \n"}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"error: {var} is set but holds no path (an empty glob?): unset it or give at least one"
    ]


def test_a_path_holding_a_space_is_refused_at_the_dry_run(tmp_path):
    spaced = tmp_path / "my shards"
    spaced.mkdir()
    (spaced / "v_text_document.idx").write_bytes(b"")
    out = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_1p7b_fixedcode.sh"), "--dry-run"],
        env=launcher_env(tmp_path, VALID_DATA_PATH=f"{spaced}/v_text_document"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"error: VALID_DATA_PATH: '{spaced}/v_text_document' holds a space, and list variables split on whitespace: "
        "rename it or link it from a path without one"
    ]


def test_login_node_dry_run_prints_the_scripts_cpus_per_task(tmp_path):
    env = launcher_env(tmp_path)
    env.pop("CPUS_PER_TASK", None)
    out = subprocess.run(
        ["bash", str(EXAMPLES / "pretrain_paper1.sh"), "binary", "--dry-run"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "cpus_per_task=64 " in out.stdout.splitlines()[0]  # #SBATCH --cpus-per-task=64, not this machine's cores
    assert "--cpus-per-task=64" in out.stdout


def test_sigterm_during_start_up_exits_at_once_with_nothing_checkpointed(tmp_path):
    """--exit-signal-handler: a signal before the first step (here: during imports and data set-up)
    ends the rank with exit 0 and one line, without a checkpoint (docs/SCALING.md, "Signals")."""
    import signal
    import time

    from tests.helpers.pretrain import TINY, write_corpus

    train, valid = write_corpus(tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "megatron_fixedcode.pretrain",
            *TINY,
            "--data-path",
            train,
            "--train-iters",
            "1000",
            "--save",
            str(tmp_path / "ckpt"),
            "--exit-signal-handler",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "received signal 15 during start-up: nothing to checkpoint yet, exiting" in err
    assert not list((tmp_path / "ckpt").glob("iter_*"))
