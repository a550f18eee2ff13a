"""Checked against Megatron-LM's own parser: for every argument list of
tests/assets/megatron_reference.json (Megatron-LM's dense-GPT examples and functional-test lists at
core_v0.16.1, the two of test_megatron_cli.py, and one per accepted flag family; written by
tools/dev/megatron_reference.py, which runs Megatron-LM's parse_args + validate_args on them), the
``--dry-run`` config here gives every dest the value Megatron-LM's parser gives it, but for the
deliberate differences of :data:`DIFFERENT`."""

from __future__ import annotations

import json

import pytest

from megatron_fixedcode.pretrain import main
from megatron_fixedcode.arguments.default_only_flags import refused_value
from megatron_fixedcode.arguments.out_of_scope import out_of_scope
from megatron_fixedcode.arguments.refusals import CONTEXT_PARALLEL_UNPROVEN
from tests.helpers.megatron_reference import DIFFERENT, REFERENCE

# Lists Megatron-LM's own parser refuses (e.g. --save-retain-interval not a multiple of --save-interval).
MEGATRON_REFUSES = {c["name"] for c in REFERENCE["cases"] if "__error__" in c["megatron"]}
# Lists Megatron-LM's parser accepts and this one refuses at parse time (Megatron-LM fails later, building the model).
REFUSED_HERE = {
    "gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split": "--num-layers 6 is not divisible by --pipeline-model-parallel-size 4"
}  # once the uneven-split flags go
# Context parallelism is refused at parse time until its parity is measured on a GPU (arguments/refusals.py).
REFUSED_HERE.update(
    {
        c["name"]: CONTEXT_PARALLEL_UNPROVEN
        for c in REFERENCE["cases"]
        if c["megatron"].get("context_parallel_size", 1) > 1 and "__error__" not in c["megatron"]
    }
)


def _megatron(case: dict) -> dict:
    values = {**REFERENCE["megatron_defaults"], **case["megatron"]}
    return {k: v for k, v in values.items() if v != "__absent__"}


def _dry_run(argv: list[str], capsys) -> dict:
    assert main([*argv, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


def test_reference_covers_the_lists_it_claims():
    names = {c["name"] for c in REFERENCE["cases"]}
    assert REFERENCE["megatron_lm"] == "core_v0.16.1" and len(names) == len(REFERENCE["cases"]) >= 100
    assert {
        "llama3_8b_h100_fp8",
        "gpt3_175b_distributed",
        "modelopt_Llama-3.1-8B-Instruct",
        "modelopt_Qwen3-8B",
        "gpt3_mcore_te_tp2_pp2",
        "gpt3_mcore_te_tp1_pp4_vp1",
    } <= names
    assert {n for n in names if n.startswith("families_")} == {
        "families_architecture",
        "families_gpt2_block",
        "families_schedule_samples",
        "families_parallel",
        "families_vpp_cp",
        "families_data_logging_checkpoint",
        "families_data_path",
        "families_inert",
    }
    assert len(MEGATRON_REFUSES) <= 2, MEGATRON_REFUSES


def test_every_megatron_flag_is_accepted_or_refused_in_one_line(capsys):
    """No flag of Megatron-LM's parser is 'unrecognized' here: each is accepted (with its meaning, inert,
    or at Megatron's default only) or refused in one line as outside this project's scope."""
    from megatron_fixedcode.arguments.core_flags import build_parser

    known = set(build_parser()._option_string_actions)
    assert [f for f in REFERENCE["megatron_flags"] if f not in known and not out_of_scope(f)] == []
    assert len(REFERENCE["megatron_flags"]) > 600
    base = next(c for c in REFERENCE["cases"] if c["name"] == "gpt3_mcore_te_tp2_pp2")["argv"]
    for flag in (
        "--moe-router-topk",
        "--window-size",
        "--cuda-graph-impl",
        "--fp4-format",
        "--inprocess-restart",
        "--eval-micro-batch-size",
        "--use-mup",
    ):  # the last two: Megatron-LM 0.19 only
        with pytest.raises(SystemExit):
            main([*base, flag, "1", "--dry-run"])
        err = capsys.readouterr().err
        assert f"{flag}: " in err and "outside this project's scope" in err
        assert ("added after core_v0.16.1" in err) == (flag in ("--eval-micro-batch-size", "--use-mup"))


def test_dry_run_matches_megatron_parser_dest_by_dest(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(REFERENCE["world_size"]))
    mismatches, missing = {}, {}
    for case in REFERENCE["cases"]:
        if case["name"] in MEGATRON_REFUSES:
            continue
        if case["name"] in REFUSED_HERE:
            with pytest.raises(SystemExit):
                main([*case["argv"], "--dry-run"])
            assert REFUSED_HERE[case["name"]] in capsys.readouterr().err
            continue
        ours = _dry_run(case["argv"], capsys)
        for dest, value in _megatron(case).items():
            if dest in DIFFERENT:
                continue
            if dest not in ours:
                missing.setdefault(dest, case["name"])
            elif json.dumps(ours[dest]) != json.dumps(value):
                mismatches.setdefault(dest, (case["name"], ours[dest], value))
    assert mismatches == {}
    assert missing == {}


def test_flags_dropped_from_the_lists_are_refused_in_one_line(capsys):
    """What tools/dev/megatron_reference.py dropped from the lists is refused here in one line naming the flag."""
    refused = {tuple(group) for case in REFERENCE["cases"] for group in case["refused"]}
    assert all(out_of_scope(group[0]) or refused_value(group[0], list(group[1:])) for group in refused)
    base = next(c for c in REFERENCE["cases"] if c["name"] == "gpt3_mcore_te_tp2_pp2")["argv"]
    for group in sorted(refused):
        with pytest.raises(SystemExit) as e:
            main([*base, *group, "--dry-run"])
        assert e.value.code == 2
        lines = [
            line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("note: ")
        ]
        assert len(lines) == 1 and f"{group[0]}" in lines[0], (group, lines)
