"""Every machine-independent refusal is made at parse time, so ``--dry-run`` refuses what a run refuses;
the rules a ``ModelConfig`` built by code obeys are the same functions the command line applies."""

from __future__ import annotations

import ast
import json

import pytest

from megatron_fixedcode.arguments.core_flags import build_parser
from megatron_fixedcode.arguments.refusals import CONTEXT_PARALLEL_UNPROVEN
from megatron_fixedcode.models.config import NO_TABLE_FOR_POSITIONS, NO_TABLE_TO_TIE, ModelConfig
from megatron_fixedcode.pretrain import main
from tests.helpers import REPO
from tests.helpers.errors import parse_refused

MODEL = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--ffn-hidden-size",
    "128",
    "--lr",
    "1e-3",
    "--train-iters",
    "2",
    "--vocab-size",
    "256",
]


_refused = parse_refused


@pytest.mark.parametrize("dry_run", [True, False])
def test_context_parallel_is_refused_by_the_dry_run_as_by_the_run(dry_run, capsys):
    argv = [*MODEL, "--mock-data", "--context-parallel-size", "2", *(["--dry-run"] if dry_run else [])]
    assert CONTEXT_PARALLEL_UNPROVEN in _refused(argv, capsys)


def test_context_parallel_1_passes_the_dry_run(capsys):
    assert main([*MODEL, "--context-parallel-size", "1", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["context_parallel_size"] == 1


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--input-embedding", "binary"], f"--input-embedding binary {NO_TABLE_TO_TIE}"),
        (["--input-embedding", "gf2", "--untie-embeddings-and-output-weights"], NO_TABLE_FOR_POSITIONS),
        (["--fp8-format", "hybrid", "--transformer-impl", "local"], "--fp8-format needs Transformer Engine layers"),
        (["--fp8-format", "hybrid"], "--fp8-format needs --bf16"),
        (["--code-matrix", "A.npy"], "--code-matrix is the GF(2) recoding matrix: it needs --input-embedding gf2"),
        (["--position-embedding-type", "mrope"], "--position-embedding-type mrope is not built here"),
    ],
)
def test_one_rule_refused_by_the_command_line_and_by_model_config(extra, words, capsys):
    assert words in _refused([*MODEL, *extra, "--dry-run"], capsys)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"input_embedding": "binary", "share_embeddings_and_output_weights": True}, NO_TABLE_TO_TIE),
        ({"input_embedding": "binary", "position_embedding_type": "learned_absolute"}, NO_TABLE_FOR_POSITIONS),
        ({"fp8": "hybrid"}, "fp8 needs bf16"),
        ({"input_embedding": "binary", "code_matrix": [[1]]}, "it needs input_embedding gf2"),
    ],
)
def test_model_config_applies_the_same_rules(fields, words):
    with pytest.raises(ValueError, match=words):
        ModelConfig(
            num_layers=1,
            hidden_size=64,
            num_attention_heads=4,
            ffn_hidden_size=128,
            seq_length=16,
            vocab_size=256,
            **fields,
        )


def test_each_flag_and_refused_prefix_is_defined_once():
    """One home per flag: no option string twice in the parser, no key twice in the refused table."""
    parser = build_parser()
    options = [o for a in parser._actions for o in a.option_strings]
    assert len(options) == len(set(options))
    tree = ast.parse((REPO / "megatron_fixedcode" / "arguments" / "out_of_scope.py").read_text())
    table = next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "OUT_OF_SCOPE")
    keys = [k.value for k in table.keys if isinstance(k, ast.Constant)]
    keys += [k.value for v in table.values if isinstance(v, ast.Call) for k in v.args[0].elts]  # dict.fromkeys(...)
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
