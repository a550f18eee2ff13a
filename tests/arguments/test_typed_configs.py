"""The typed parts of PretrainConfig carry the flags as parsed: the trainer reads them, never the Namespace
(tests/repository/test_architecture.py checks that), so a part that dropped or renamed a flag would silently
train with its default."""

import argparse
import dataclasses
import importlib

import pytest

from megatron_fixedcode.arguments.config_fields import field_dest, own_dests
from megatron_fixedcode.arguments.core_flags import build_parser
from megatron_fixedcode.arguments.downstream_flags import DownstreamConfig
from megatron_fixedcode.arguments.observe_flags import WatchConfig
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from tests.helpers.pretrain import TINY

BASE = [*TINY, "--mock-data", "--train-iters", "4"]


def test_default_parts_are_the_parsers_defaults():
    """``WatchConfig()`` and ``DownstreamConfig()`` (what a stand-in trainer uses) watch and score nothing, as
    the parser's defaults do."""
    defaults = build_parser().parse_args([])
    assert WatchConfig.from_args(defaults) == dataclasses.replace(WatchConfig(), log_interval=defaults.log_interval)
    assert DownstreamConfig.from_args(defaults) == DownstreamConfig()


@pytest.mark.parametrize(
    "flags, part, expected",
    [
        (["--num-workers", "0"], "data", {"num_workers": 0, "mock": True, "seq_length": 32}),
        (
            ["--no-mmap-bin-files", "--data-cache-path", "/tmp/c"],
            "data",
            {"mmap_bin_files": False, "cache_path": "/tmp/c"},
        ),
        (
            [
                "--iterations-to-skip",
                "3",
                "5",
                "--manual-gc",
                "--manual-gc-interval",
                "7",
                "--rerun-mode",
                "disabled",
                "--no-check-for-nan-in-loss-and-grad",
                "--distributed-timeout-minutes",
                "3",
            ],
            "health",
            {
                "iterations_to_skip": (3, 5),
                "manual_gc": True,
                "manual_gc_interval": 7,
                "rerun_mode": "disabled",
                "check_for_nan_in_loss_and_grad": False,
                "distributed_timeout_minutes": 3,
            },
        ),
        (
            ["--bf16", "--overlap-grad-reduce", "--use-distributed-optimizer", "--no-bias-dropout-fusion"],
            "performance",
            {
                "bf16": True,
                "precision": "bf16",
                "overlap_grad_reduce": True,
                "bias_dropout_fusion": False,
                "transformer_impl": "local",
            },
        ),
        (
            [
                "--log-straggler",
                "--straggler-minmax-count",
                "4",
                "--profile",
                "--use-pytorch-profiler",
                "--tensorboard-dir",
                "/tmp/tb",
                "--profile-ranks",
                "0",
                "1",
                "--check-weight-hash-across-dp-replicas-interval",
                "9",
            ],
            "watch",
            {
                "log_straggler": True,
                "straggler_minmax_count": 4,
                "profile_ranks": (0, 1),
                "check_weight_hash_across_dp_replicas_interval": 9,
                "log_interval": 1,
            },
        ),
        (
            [
                "--save",
                "/tmp/s",
                "--async-save",
                "--use-persistent-ckpt-worker",
                "--hf-export-interval",
                "2",
                "--hf-export-dir",
                "/tmp/hf",
                "--no-dist-ckpt-optim-fully-reshardable",
            ],
            "checkpoint",
            {"async_save": True, "hf_export_interval": 2, "hf_export_dir": "/tmp/hf", "fully_reshardable": False},
        ),
        (["--skip-train", "--load", "/tmp/l"], "schedule", {"skip_train": True, "micro_batch_size": 2}),
        (["--log-throughput"], "logging", {"log_throughput": True}),
    ],
)
def test_each_part_carries_its_flags(flags, part, expected):
    got = dataclasses.asdict(getattr(parse_pretrain_args([*BASE, *flags]), part))
    assert {k: got[k] for k in expected} == expected


def test_the_recorded_flags_name_the_tokenizer_in_force():
    """A resume that takes the checkpoint's tokenizer records it in run_config, as the flags would."""
    cfg = parse_pretrain_args(BASE)
    cfg.tokenizer = dataclasses.replace(cfg.tokenizer, tokenizer_model="/ckpt/tokenizer.json")
    assert cfg.as_dict()["tokenizer_model"] == "/ckpt/tokenizer.json"
    assert cfg.args.tokenizer_model is None  # the command line as given


def _dests_added_by(add) -> set[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add(parser)
    return {action.dest for action in parser._actions}


@pytest.mark.parametrize(
    "module, add, config",
    [
        ("optimizer_flags", "add_optimizer_args", "OptimConfig"),
        ("schedule_flags", "add_schedule_args", "ScheduleConfig"),
        ("checkpoint_flags", "add_checkpoint_args", "CheckpointConfig"),
        ("logging_flags", "add_logging_args", "LoggingConfig"),
        ("performance_flags", "add_performance_args", "PerformanceConfig"),
        ("health_flags", "add_health_args", "HealthConfig"),
        ("downstream_flags", "add_downstream_args", "DownstreamConfig"),
        ("observe_flags", "add_observe_args", "WatchConfig"),
    ],
)
def test_each_flags_module_owns_exactly_the_flags_of_its_config(module, add, config):
    """One home per flag: the module's flags are its config's fields, less what the field metadata names
    (renamed: another dest; borrowed: a flag another module owns; derived: set by the derivations). ``--num-workers``
    is the data's (DataConfig), added beside the watch flags."""
    mod = importlib.import_module(f"megatron_fixedcode.arguments.{module}")
    dests = _dests_added_by(getattr(mod, add)) - {"num_workers"}
    assert dests == own_dests(getattr(mod, config))
    for field in dataclasses.fields(getattr(mod, config)):  # a borrowed or derived dest has no flag here
        if "owner" in field.metadata or "derived" in field.metadata:
            assert field_dest(field) not in dests
