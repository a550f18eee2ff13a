"""A Megatron-LM user's command line runs here unchanged — Megatron-LM's flags (core_v0.16.1),
their meanings and defaults, its log line and TensorBoard tags; the refusals are one line each."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import types

import pytest
import torch

from megatron_fixedcode.pretrain import main
from megatron_fixedcode.arguments.core_flags import build_parser
from megatron_fixedcode.arguments.derivations import train_paths, valid_paths
from megatron_fixedcode.arguments.parse import parse_pretrain_args
from tests.helpers import REPO
from tests.helpers.pretrain import TINY, pretrain, read_metrics, write_corpus

# The flag lists of Megatron-LM's examples at core_v0.16.1, copied as data; sizes shrunk (marked "shrunk").
# examples/llama/train_llama3_8b_h100_fp8.sh, the real-data configuration:
LLAMA3_8B_FP8 = [
    "--use-mcore-models",
    "--num-layers",
    "2",  # shrunk: 32
    "--hidden-size",
    "64",
    "--ffn-hidden-size",
    "224",
    "--num-attention-heads",
    "4",  # shrunk: 4096, 14336, 32
    "--group-query-attention",
    "--num-query-groups",
    "2",
    "--kv-channels",
    "16",  # shrunk: 8, 128
    "--seq-length",
    "32",
    "--max-position-embeddings",
    "32",  # shrunk: 8192
    "--position-embedding-type",
    "rope",
    "--rotary-base",
    "1000000",
    "--rotary-percent",
    "1.0",
    "--attention-dropout",
    "0.0",
    "--hidden-dropout",
    "0.0",
    "--swiglu",
    "--init-method-std",
    "0.0134",
    "--attention-backend",
    "fused",
    "--apply-layernorm-1p",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--micro-batch-size",
    "1",
    "--global-batch-size",
    "8",  # shrunk: 128
    "--train-samples",
    "64",
    "--lr-decay-samples",
    "56",
    "--lr-warmup-samples",
    "16",  # shrunk
    "--lr",
    "0.00015",
    "--min-lr",
    "0.00001",
    "--decoupled-lr",
    "5.0e-4",
    "--decoupled-min-lr",
    "4.5e-5",
    "--lr-decay-style",
    "cosine",
    "--clip-grad",
    "1.0",
    "--weight-decay",
    "0.1",
    "--adam-beta1",
    "0.9",
    "--adam-beta2",
    "0.95",
    "--bf16",
    "--grad-reduce-in-bf16",
    "--cross-entropy-loss-fusion",
    "--calculate-per-token-loss",
    "--manual-gc",
    "--empty-unused-memory-level",
    "1",
    "--exit-duration-in-mins",
    "235",
    "--fp8-format",
    "hybrid",
    "--fp8-amax-history-len",
    "1024",
    "--fp8-amax-compute-algo",
    "max",
    "--fp8-param-gather",
    "--tensor-model-parallel-size",
    "1",
    "--context-parallel-size",
    "1",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--data-path",
    "DATA",
    "--tokenizer-type",
    "HuggingFaceTokenizer",
    "--tokenizer-model",
    "TOKENIZER",
    "--data-cache-path",
    "CACHE",
    "--split",
    "99,1,0",
    "--no-create-attention-mask-in-dataloader",
    "--no-mmap-bin-files",
    "--num-workers",
    "1",
    "--vocab-size",
    "1024",  # shrunk: 128256
    "--log-interval",
    "1",
    "--eval-iters",
    "2",
    "--eval-interval",
    "100",  # shrunk: 32 eval iters
    "--save-interval",
    "1000",
    "--log-throughput",
    "--profile",
    "--profile-step-start",
    "4",
    "--profile-step-end",
    "6",
    "--ckpt-format",
    "torch_dist",
    "--distributed-timeout-minutes",
    "60",
    "--save",
    "CKPT",
    "--load",
    "CKPT",
    "--tensorboard-dir",
    "TB",
]
# examples/gpt3/train_gpt3_175b_distributed.sh:
GPT3_175B = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",  # shrunk: 96, 12288, 96
    "--seq-length",
    "32",
    "--max-position-embeddings",
    "32",
    "--attention-backend",
    "auto",  # shrunk: 2048
    "--micro-batch-size",
    "1",
    "--global-batch-size",
    "4",
    "--rampup-batch-size",
    "16",
    "16",
    "5859375",
    "--train-iters",
    "4",
    "--weight-decay",
    "0.1",
    "--adam-beta1",
    "0.9",
    "--adam-beta2",
    "0.95",  # shrunk: 500000
    "--init-method-std",
    "0.006",
    "--clip-grad",
    "1.0",
    "--fp16",
    "--lr",
    "6.0e-5",
    "--lr-decay-style",
    "cosine",
    "--min-lr",
    "6.0e-6",
    "--lr-warmup-fraction",
    ".25",
    "--lr-decay-iters",
    "4",  # shrunk: .001, 430000
    "--tensor-model-parallel-size",
    "1",
    "--pipeline-model-parallel-size",
    "1",  # shrunk: 8, 16
    "--data-path",
    "DATA",
    "--vocab-file",
    "VOCAB",
    "--merge-file",
    "MERGES",
    "--split",
    "949,50,1",
    "--log-interval",
    "100",
    "--save-interval",
    "10000",
    "--eval-interval",
    "1000",
    "--save",
    "CKPT",
    "--load",
    "CKPT",
    "--eval-iters",
    "10",
    "--tensorboard-dir",
    "TB",
]


def _without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` less ``flags`` and their values (the tokens up to the next ``--flag``)."""
    out, skip = [], False
    for token in argv:
        if token.startswith("--"):
            skip = token in flags
        if not skip:
            out.append(token)
    return out


def _fill(argv: list[str], corpus, tmp_path, **names: str) -> list[str]:
    names = {
        "DATA": corpus[0],
        "CKPT": str(tmp_path / "ckpt"),
        "TB": str(tmp_path / "tb"),
        "CACHE": str(tmp_path / "cache"),
        **names,
    }
    return [names.get(t, t) for t in argv]


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and not line.startswith("note: ")]
    assert len(lines) == 1 and ": error: " in lines[0], lines
    return lines[0]


def _train(*argv: str) -> subprocess.CompletedProcess:
    """The trainer with exactly ``argv`` (no test defaults), one CPU process."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_fixedcode.pretrain", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _dry_run(argv: list[str], capsys) -> dict:
    assert main([*argv, "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def gpt2_corpus(tmp_path_factory) -> dict:
    """GPT-2 BPE files (tests/helpers/__init__.py) and a book of tests/assets indexed with them by
    preprocess_data in Megatron-LM's spelling, one paragraph a document."""
    from megatron_fixedcode.cli.preprocess_data import main as preprocess_data
    from tests.helpers import ASSETS, write_gpt2_bpe_files

    root = tmp_path_factory.mktemp("gpt2")
    vocab, merges = write_gpt2_bpe_files(root)
    text = (ASSETS / "corpus" / "gutenberg" / "pg84-0.txt").read_text(encoding="utf-8")
    paragraphs = [p for p in re.split(r"\r?\n\s*\n", text) if p.strip()]
    (root / "book.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs), encoding="utf-8")
    assert (
        preprocess_data(
            [
                "--input",
                str(root / "book.jsonl"),
                "--output-prefix",
                str(root / "book"),
                "--tokenizer-type",
                "GPT2BPETokenizer",
                "--vocab-file",
                str(vocab),
                "--merge-file",
                str(merges),
                "--append-eod",
                "--valid-fraction",
                "0",
            ]
        )
        == 0
    )
    return {"DATA": str(root / "book_train_text_document"), "VOCAB": str(vocab), "MERGES": str(merges)}


def test_llama3_example_flags_have_megatron_meaning(corpus, tmp_path, capsys, caplog):
    argv = _without(_fill(LLAMA3_8B_FP8, corpus, tmp_path), "--tokenizer-model")
    resolved = _dry_run(argv, capsys)
    megatron_meaning = {  # what Megatron-LM's parser and validate_args give these flags
        "num_layers": 2,
        "hidden_size": 64,
        "ffn_hidden_size": 224,
        "num_attention_heads": 4,
        "group_query_attention": True,
        "num_query_groups": 2,
        "kv_channels": 16,
        "seq_length": 32,
        "max_position_embeddings": 32,
        "position_embedding_type": "rope",
        "rotary_base": 1000000,
        "rotary_percent": 1.0,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "swiglu": True,
        "normalization": "LayerNorm",
        "init_method_std": 0.0134,
        "attention_backend": "fused",
        "layernorm_zero_centered_gamma": True,
        "untie_embeddings_and_output_weights": True,
        "add_bias_linear": False,
        "micro_batch_size": 1,
        "global_batch_size": 8,
        "train_samples": 64,
        "train_iters": None,
        "lr_decay_samples": 56,
        "lr_warmup_samples": 16,
        "lr": 0.00015,
        "min_lr": 0.00001,
        "decoupled_lr": 5.0e-4,
        "decoupled_min_lr": 4.5e-5,
        "lr_decay_style": "cosine",
        "clip_grad": 1.0,
        "weight_decay": 0.1,
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_eps": 1e-8,
        "bf16": True,
        "fp16": False,
        "grad_reduce_in_bf16": True,
        "cross_entropy_loss_fusion": True,
        "calculate_per_token_loss": True,
        "manual_gc": True,
        "empty_unused_memory_level": 1,
        "exit_duration_in_mins": 235,
        "fp8": "hybrid",
        "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max",
        "fp8_param_gather": True,
        "tensor_model_parallel_size": 1,
        "context_parallel_size": 1,
        "sequence_parallel": False,  # Megatron-LM turns it off at TP 1
        "use_distributed_optimizer": True,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "data_path": [corpus[0]],
        "tokenizer_type": "HuggingFaceTokenizer",
        "split": "99,1,0",
        "create_attention_mask_in_dataloader": False,
        "mmap_bin_files": False,
        "num_workers": 1,
        "vocab_size": 1024,
        "log_interval": 1,
        "eval_iters": 2,
        "eval_interval": 100,
        "save_interval": 1000,
        "log_throughput": True,
        "profile": True,
        "profile_step_start": 4,
        "profile_step_end": 6,
        "ckpt_format": "torch_dist",
        "distributed_timeout_minutes": 60,
        "transformer_impl": "transformer_engine",
        "layernorm_epsilon": 1e-5,
        "seed": 1234,
        "tensorboard_log_interval": 1,
        "exit_signal": 15,
        "recompute_granularity": None,
    }
    assert {k: resolved[k] for k in megatron_meaning} == megatron_meaning
    assert resolved["block"] == "layernorm_swiglu"  # LayerNorm (1p) + SwiGLU, as Megatron-LM builds it
    # the LR schedule in steps of the global batch, as Megatron-LM counts samples
    cfg = parse_pretrain_args(argv)
    from megatron_fixedcode.training.lr_schedule import scheduler_settings

    assert cfg.schedule.max_steps(8) == 8
    assert {k: scheduler_settings(cfg.optim, 8, 8)[k] for k in ("lr_warmup_steps", "lr_decay_steps")} == {
        "lr_warmup_steps": 2,
        "lr_decay_steps": 7,
    }
    # training it on this CPU: FP8 is refused in one line (exit 2) before any work
    from megatron_fixedcode.training.loop import run_pretraining

    assert run_pretraining(cfg) == 2
    assert "--fp8-format hybrid needs a CUDA GPU" in capsys.readouterr().err + caplog.text


@pytest.mark.slow
def test_gpt3_example_flags_refused_in_one_line_then_trained(corpus, gpt2_corpus, tmp_path, capsys):
    """Its GPT-2 BPE (--vocab-file, --merge-file, no --tokenizer-type) reads as GPT2BPETokenizer, trains on
    data preprocess_data indexed with it, and the checkpoint and HF export carry it."""
    argv = _fill(GPT3_175B, corpus, tmp_path, **gpt2_corpus)
    assert "--rampup-batch-size: batch-size ramp-up" in _refused(argv, capsys)
    argv = _without(argv, "--rampup-batch-size")
    assert "--fp16: FP16 training with loss scaling" in _refused(argv, capsys)
    argv = _without(argv, "--fp16")
    assert "--merge-file: read with --tokenizer-type GPT2BPETokenizer" in _refused(
        [*_without(argv, "--vocab-file"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024"], capsys
    )
    assert "needs both --vocab-file and --merge-file" in _refused(
        [*_without(argv, "--merge-file"), "--tokenizer-type", "GPT2BPETokenizer"], capsys
    )
    # a fixed code has no table to tie to the output layer, nor one to add learned positions to
    assert "--input-embedding binary has no table to tie" in _refused([*argv, "--input-embedding", "binary"], capsys)
    assert "with --position-embedding-type learned_absolute" in _refused(
        [*argv, "--input-embedding", "binary", "--untie-embeddings-and-output-weights"], capsys
    )
    assert "--no-position-embedding is deprecated" in _refused([*argv, "--no-position-embedding"], capsys)
    argv += ["--transformer-impl", "local"]  # Megatron-LM's default GPT-2 block, with its learned table
    assert main([*argv, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    resolved = json.loads(out)
    assert (
        resolved["tokenizer_type"],
        resolved["vocab_file"],
        resolved["merge_file"],
        resolved["tokenizer_model"],
    ) == ("GPT2BPETokenizer", gpt2_corpus["VOCAB"], gpt2_corpus["MERGES"], None)
    assert f"vocabulary 1,001 ({gpt2_corpus['VOCAB']}), padded 1,024" in err  # Megatron-LM: len(vocab.json), x128
    megatron_meaning = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "seq_length": 32,
        "ffn_hidden_size": 256,
        "kv_channels": 16,  # derived by Megatron-LM's validate_args: 4 x hidden, hidden / heads
        "max_position_embeddings": 32,
        "micro_batch_size": 1,
        "global_batch_size": 4,
        "train_iters": 4,
        "weight_decay": 0.1,
        "adam_beta2": 0.95,
        "init_method_std": 0.006,
        "lr": 6.0e-5,
        "lr_decay_style": "cosine",
        "min_lr": 6.0e-6,
        "lr_warmup_fraction": 0.25,
        "lr_decay_iters": 4,
        "split": "949,50,1",
        "log_interval": 100,
        "save_interval": 10000,
        "eval_interval": 1000,
        "eval_iters": 10,
        "normalization": "LayerNorm",
        "swiglu": False,
        "hidden_dropout": 0.1,
        "attention_dropout": 0.1,
        "num_query_groups": 1,
        "group_query_attention": False,
        "ckpt_keep_last": None,
        "save_retain_interval": None,
        "position_embedding_type": "learned_absolute",
        "add_bias_linear": True,
        "untie_embeddings_and_output_weights": False,
        "input_embedding": "learned",
    }
    assert {k: resolved[k] for k in megatron_meaning} == megatron_meaning
    metrics = tmp_path / "metrics.jsonl"
    # the tiny corpus's 270 documents leave a 0.1% test part empty: --split 90,9,1 for the run
    proc = _train(
        *_without(argv, "--eval-interval", "--save-interval", "--tensorboard-dir", "--split"),
        "--split",
        "90,9,1",
        "--metrics-file",
        str(metrics),
    )
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    # warmup = 0.25 x 4 decay steps = 1 step: the first step's LR is the peak, as Megatron-LM's scheduler
    assert records[0]["lr"] == pytest.approx(6.0e-5)
    assert re.search(r" iteration +4/ +4 \| consumed samples: +16 \|", proc.stderr)
    # the checkpoint holds Megatron-LM's GPT-2 block: learned positions, linear biases, the head tied to the table
    from tokenizers import Tokenizer

    from megatron_fixedcode.checkpoint import load_megatron_checkpoint
    from megatron_fixedcode.export.hf_io import write_tokenizer
    from megatron_fixedcode.export.to_hf import hf_tensors_and_config
    from megatron_fixedcode.tokenizers import build_tokenizer

    loaded = load_megatron_checkpoint(tmp_path / "ckpt")
    names = set(loaded.model.state_dict())
    assert {
        "embedding.position_embeddings.weight",
        "decoder.layers.0.mlp.linear_fc1.bias",
        "decoder.layers.0.self_attention.linear_qkv.bias",
    } <= names
    assert loaded.model.embedding.position_embeddings.weight.shape == (32, 64)
    assert (
        loaded.model.output_layer.weight is None
        and loaded.model.shared_embedding_or_output_weight() is loaded.model.embedding.word_embeddings.weight
    )
    # ... and exports to GPT2LMHeadModel, the head tied (tests/export/test_export_gpt2.py checks the logits)
    tensors, config = hf_tensors_and_config(
        loaded.model.state_dict(), loaded.model_cfg, bos_token_id=None, eos_token_id=None
    )
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["tie_word_embeddings"]
    assert tensors["transformer.wpe.weight"].shape == (32, 64) and "lm_head.weight" not in tensors
    # the tokenizer it records, and the tokenizer.json an export writes from it, give our ids
    record = {"type": "GPT2BPETokenizer", "model": gpt2_corpus["VOCAB"], "merge_file": gpt2_corpus["MERGES"]}
    saved = loaded.trainer_state["tokenizer"]
    assert {k: saved[k] for k in record} == record  # and the copy it carries: vocab.json + merges.txt
    assert sorted(f.rsplit("/", 1)[1] for f in saved["copy"]["files"]) == ["merges.txt", "vocab.json"]
    ours = build_tokenizer("GPT2BPETokenizer", record["model"], merge_file=record["merge_file"])
    (tmp_path / "hf").mkdir()
    write_tokenizer(tmp_path / "hf", "GPT2BPETokenizer", record["model"], ours, 32)
    text = "It was on a dreary night of November — “naïve” 🙂  twice\r\n"
    assert Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json")).encode(text).ids == ours.tokenize(text)
    assert json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"


def test_out_of_scope_flags_and_abbreviations_refused_in_one_line(capsys):
    base = [*TINY, "--train-iters", "2"]
    for flag in (
        "--num-experts",
        "--moe-router-topk",
        "--mtp-num-layers",
        "--hybrid-override-pattern",
        "--multi-latent-attention",
    ):
        line = _refused([*base, flag, "4"], capsys)
        assert f"{flag}: " in line and "outside this project's scope" in line, line
    # Megatron-LM sets allow_abbrev=False: --save-int is not --save-interval
    assert "unrecognized arguments: --save-int" in _refused([*base, "--save-int", "7"], capsys)
    assert "unrecognized arguments: --no-such-flag" in _refused([*base, "--no-such-flag"], capsys)


def test_megatron_defaults(capsys):
    minimal = [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--ffn-hidden-size",
        "128",
        "--seq-length",
        "32",
        "--train-iters",
        "2",
        "--vocab-size",
        "1024",
        "--block",
        "llama",
    ]
    assert "--lr is required" in _refused(minimal, capsys)
    a = _dry_run([*minimal, "--lr", "1e-3"], capsys)
    assert {
        k: a[k]
        for k in (
            "adam_beta2",
            "lr_decay_style",
            "log_interval",
            "eval_iters",
            "transformer_impl",
            "hidden_dropout",
            "attention_dropout",
            "tf32",
            "ckpt_keep_last",
            "save_retain_interval",
            "num_query_groups",
            "exit_signal",
        )
    } == {
        "adam_beta2": 0.999,
        "lr_decay_style": "linear",
        "log_interval": 100,
        "eval_iters": 100,
        "transformer_impl": "transformer_engine",
        "hidden_dropout": 0.1,
        "attention_dropout": 0.1,
        "tf32": False,
        "ckpt_keep_last": None,
        "save_retain_interval": None,
        "num_query_groups": 1,
        "exit_signal": 15,
    }
    # the dropout reaches the model; --num-query-groups acts only with --group-query-attention
    cfg = parse_pretrain_args([*minimal, "--lr", "1e-3", "--num-query-groups", "2", "--dry-run"])
    model = cfg.model_config(1024)
    assert (model.hidden_dropout, model.attention_dropout, model.num_query_groups) == (0.1, 0.1, None)
    assert (
        parse_pretrain_args(
            [*minimal, "--lr", "1e-3", "--num-query-groups", "2", "--group-query-attention", "--dry-run"]
        )
        .model_config(1024)
        .num_query_groups
        == 2
    )


def test_defaults_and_flag_spellings_match_megatron():
    """Every default shared with Megatron-LM's parser is its default (read from that parser by
    tools/dev/megatron_reference.py), but for test_megatron_reference.DIFFERENT."""
    from tests.helpers.megatron_reference import DIFFERENT, REFERENCE

    p = build_parser()
    defaults = {}
    for a in p._actions:  # argparse: the first action of a dest sets its default
        defaults.setdefault(a.dest, a.default)
    megatron = {k: v for k, v in REFERENCE["megatron_defaults"].items() if k in defaults and k not in DIFFERENT}
    assert len(megatron) > 150
    assert {
        k: json.loads(json.dumps(str(defaults[k]) if k == "transformer_impl" else defaults[k])) for k in megatron
    } == megatron
    flags = set(p._option_string_actions)
    for spelling in (
        "--use-checkpoint-opt_param-scheduler",
        "--override-opt_param-scheduler",
        "--norm-epsilon",
        "--apply-layernorm-1p",
        "--no-rope-fusion",
        "--fp8-format",
        "--persistent-save-interval",
    ):
        assert spelling in flags
    assert p._option_string_actions["--fp8-format"].dest == "fp8"
    assert p._option_string_actions["--norm-epsilon"].dest == "layernorm_epsilon"


def test_every_flag_has_help_and_help_shows_defaults(capsys):
    p = build_parser()
    assert [a.option_strings for a in p._actions if not a.help] == []
    with pytest.raises(SystemExit):
        p.parse_args(["-h"])
    out = capsys.readouterr().out
    assert "--adam-beta2 ADAM_BETA2" in out and "(default: 0.999)" in out


def test_recipe_keys_are_megatron_dests(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("norm_epsilon: 1.0e-6\n")
    assert "unknown key 'norm_epsilon'" in _refused(["--config", str(recipe), *TINY, "--train-iters", "2"], capsys)
    recipe.write_text("layernorm_epsilon: 1.0e-6\nfp8: null\napply_rope_fusion: false\n")
    a = _dry_run(["--config", str(recipe), *TINY, "--train-iters", "2"], capsys)
    assert (a["layernorm_epsilon"], a["apply_rope_fusion"]) == (1e-6, False)
    recipe.write_text("num_experts: 8\n")
    assert "num_experts: mixture of experts: outside this project's scope" in _refused(
        ["--config", str(recipe), *TINY, "--train-iters", "2"], capsys
    )


def test_data_path_wins_over_split_paths(capsys):
    a = parse_pretrain_args(
        [*TINY, "--train-iters", "2", "--dry-run", "--data-path", "A", "--valid-data-path", "B"]
    ).args
    assert (train_paths(a), valid_paths(a)) == (["A"], None)  # --split carves validation out of A
    assert "--valid-data-path is ignored" in capsys.readouterr().err
    a = parse_pretrain_args(
        [*TINY, "--train-iters", "2", "--dry-run", "--train-data-path", "A", "--valid-data-path", "B"]
    ).args
    assert (train_paths(a), valid_paths(a), a.data_path) == (["A"], ["B"], None)
    a = parse_pretrain_args(
        [
            "--num-layers",
            "2",
            "--hidden-size",
            "64",
            "--num-attention-heads",
            "4",
            "--ffn-hidden-size",
            "128",
            "--seq-length",
            "32",
            "--lr",
            "1",
            "--train-iters",
            "2",
            "--block",
            "llama",
            "--vocab-size",
            "1024",
            "--dry-run",
            "--data-path",
            "A",
        ]
    ).args
    assert a.split == "969, 30, 1"  # Megatron-LM's legacy default when --data-path comes without --split


def test_exit_signal_handler_catches_only_the_exit_signal():
    from megatron_fixedcode.training.loop import ExitRequest

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        request = ExitRequest(True)
        assert signal.getsignal(signal.SIGUSR1) == saved[signal.SIGUSR1]
        signal.raise_signal(signal.SIGTERM)
        assert request.flag
        request = ExitRequest(
            True,
            parse_pretrain_args(
                [*TINY, "--train-iters", "2", "--dry-run", "--exit-signal", "SIGUSR1"]
            ).checkpoint.exit_signal,
        )
        signal.raise_signal(signal.SIGUSR1)
        assert request.flag
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_recompute_flags_reach_transformer_config(capsys):
    from megatron_fixedcode.models import build_transformer_config

    base = [*TINY, "--train-iters", "2", "--dry-run"]
    assert "needs --recompute-method" in _refused([*base, "--recompute-granularity", "full"], capsys)
    cfg = parse_pretrain_args(
        [*base, "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"]
    )
    config = build_transformer_config(cfg.model_config(1024), cfg.layout, te_layers=False)
    assert (config.recompute_granularity, config.recompute_method, config.recompute_num_layers) == ("full", "block", 2)
    cfg = parse_pretrain_args([*base, "--recompute-activations"])
    assert (
        build_transformer_config(cfg.model_config(1024), cfg.layout, te_layers=False).recompute_granularity
        == "selective"
    )


@pytest.mark.slow
def test_qk_layernorm_qkv_bias_squared_relu_and_rope_scaling_train(corpus, tmp_path, capsys):
    """Megatron-LM's --qk-layernorm, --add-qkv-bias, --squared-relu and --use-rope-scaling reach the
    model that trains, as megatron-core builds them; a SwiGLU block refuses --squared-relu in one line."""
    import torch

    from megatron_fixedcode.checkpoint.single_process import build_single_rank_model, load_megatron_checkpoint
    from megatron_fixedcode.models import build_transformer_config

    argv = [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "32",
        "--max-position-embeddings",
        "32",
        "--micro-batch-size",
        "2",
        "--global-batch-size",
        "4",
        "--lr",
        "1e-3",
        "--train-iters",
        "2",
        "--vocab-size",
        "1024",
        "--make-vocab-size-divisible-by",
        "8",
        "--disable-bias-linear",
        "--untie-embeddings-and-output-weights",
        "--position-embedding-type",
        "rope",
        "--transformer-impl",
        "local",
        "--qk-layernorm",
        "--add-qkv-bias",
        "--squared-relu",
        "--use-rope-scaling",
        "--rope-scaling-factor",
        "16",
        "--data-path",
        corpus[0],
        "--split",
        "90,9,1",
        "--log-interval",
        "1",
        "--save",
        str(tmp_path / "ckpt"),
    ]
    assert "squared_relu replaces the GELU MLP" in _refused([*argv, "--swiglu", "--dry-run"], capsys)
    cfg = parse_pretrain_args([*argv, "--dry-run"]).model_config(1024)
    config = build_transformer_config(cfg, parse_pretrain_args([*argv, "--dry-run"]).layout, te_layers=False)
    assert (config.qk_layernorm, config.add_qkv_bias, config.add_bias_linear) == (True, True, False)
    x = torch.tensor([-2.0, 0.5, 3.0])
    assert torch.equal(config.activation_func(x), torch.tensor([0.0, 0.25, 9.0]))  # relu(x)^2
    import dataclasses

    scaled = build_single_rank_model(cfg).rotary_pos_emb.inv_freq
    plain = build_single_rank_model(dataclasses.replace(cfg, rope_scaling=False)).rotary_pos_emb.inv_freq
    assert torch.equal(scaled[:2], plain[:2]) and not torch.equal(scaled, plain)  # Llama-3 scales the low frequencies
    _train(*argv)
    names = set(load_megatron_checkpoint(tmp_path / "ckpt").model.state_dict())
    assert {
        "decoder.layers.0.self_attention.q_layernorm.weight",
        "decoder.layers.0.self_attention.k_layernorm.weight",
        "decoder.layers.0.self_attention.linear_qkv.bias",
    } <= names
    assert "decoder.layers.0.mlp.linear_fc1.bias" not in names
    # resuming it as another architecture is refused in one line before any step
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_fixedcode.pretrain",
            *_without(argv, "--qk-layernorm"),
            "--train-iters",
            "3",
            "--load",
            str(tmp_path / "ckpt"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "checkpoint has qk_layernorm=True, this run qk_layernorm=False" in proc.stderr


def test_checkpoint_retention(tmp_path):
    from megatron_fixedcode.checkpoint.save import _prune

    def run(keep_last, retain):
        root = tmp_path / f"{keep_last}-{retain}"
        for step in range(1, 7):
            (root / f"iter_{step:07d}").mkdir(parents=True)
            _prune(root, keep_last, step, retain)
        return sorted(int(p.name[5:]) for p in root.glob("iter_*"))

    assert run(None, None) == [1, 2, 3, 4, 5, 6]  # Megatron-LM keeps every checkpoint
    assert run(None, 2) == [2, 4, 6]
    assert run(2, None) == [5, 6]


class _Recorder:
    def __init__(self):
        self.tags = {}

    def add_scalar(self, tag, value, step):
        self.tags.setdefault(tag, []).append((step, value))

    def close(self):
        pass


def test_megatron_log_line_tensorboard_tags_and_mfu_peak(caplog, monkeypatch):
    from megatron_fixedcode.training import metrics
    from megatron_fixedcode.arguments.logging_flags import LoggingConfig

    cfg = LoggingConfig(log_interval=2, tensorboard_dir=None, metrics_file=None, wandb_project=None)
    sink = metrics.MetricsSink(
        cfg,
        enabled=True,
        max_steps=4,
        flops_per_token=6e6,
        num_gpus=1,
        run_config={},
        global_batch=8,
        matmul="fp32",
        code="gf2:abc123",
    )
    sink.tensorboard = _Recorder()
    with caplog.at_level(logging.INFO, logger=metrics.__name__):
        for step in (1, 2):
            sink.record(
                {
                    "step": step,
                    "loss": 4.0 + step,
                    "lr": 1e-4,
                    "grad_norm": 0.5,
                    "tokens": 256 * step,
                    "step_tokens": 256,
                    "step_time_s": 0.1,
                    **({"val_loss": 3.0, "val_ppl": 20.1} if step == 2 else {}),
                }
            )
    line = next(
        r.getMessage() for r in caplog.records if "iteration" in r.getMessage() and "consumed" in r.getMessage()
    )
    assert re.fullmatch(
        r" \[[\d\- :.]+\] iteration +2/ +4 \| consumed samples: +16 \| elapsed time per iteration \(ms\): [\d.]+ \|"
        r" learning rate: 1\.000000E-04 \| global batch size: +8 \| lm loss: 5\.500000E\+00 \| loss scale: 1\.0 \|"
        r" grad norm: 0\.500 \| number of skipped iterations: +0 \| number of nan iterations: +0 \|"
        r" tokens/s: [\d,]+ \| mem \(GiB\): [\d.]+ \| ETA: [\d:]+ \| code: gf2:abc123 \|",
        line,
    ), line
    assert "validation loss at iteration 2 | lm loss value: 3.000000E+00 | lm loss PPL: 2.010000E+01 |" in caplog.text
    for tag in (
        "lm loss",
        "learning-rate",
        "grad-norm",
        "batch-size",
        "loss-scale",
        "iteration-time",
        "lm loss vs samples",
        "lm loss validation",
        "lm loss validation ppl",
    ):
        assert tag in sink.tensorboard.tags, tag
    assert not any(t.startswith("train/") for t in sink.tensorboard.tags)
    # MFU against the peak of the precision in use: FP32 runs against the FP32 peak, not BF16's
    assert metrics.matmul_precision("fp32", tf32=False) == "fp32"
    assert metrics.matmul_precision("fp32", tf32=True) == "tf32"
    assert metrics.matmul_precision("fp32-autocast-bf16", tf32=False) == "bf16"
    assert metrics.device_peak_flops("NVIDIA H100 80GB HBM3", "fp32") == 66.9e12


def test_wandb_run_id_is_kept_with_the_checkpoint(monkeypatch):
    from megatron_fixedcode.training import metrics, run_parts
    from megatron_fixedcode.arguments.logging_flags import LoggingConfig

    cfg = parse_pretrain_args([*TINY, "--train-iters", "2", "--dry-run", "--wandb-project", "p", "--load", "/ckpt"])
    assert run_parts.wandb_run_id(cfg, {"step": 3, "wandb_run_id": "run42"}) == "run42"  # the state resumed from
    fresh = run_parts.wandb_run_id(cfg, None)  # a fresh start (or --finetune)
    assert fresh and fresh != "run42"
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw)))
    metrics.MetricsSink(
        LoggingConfig(log_interval=1, tensorboard_dir=None, metrics_file=None, wandb_project="p", wandb_exp_name="exp"),
        enabled=True,
        max_steps=1,
        flops_per_token=1.0,
        num_gpus=1,
        run_config={},
        wandb_run_id="run42",
    )
    assert calls[0]["id"] == "run42" and calls[0]["resume"] == "allow" and calls[0]["name"] == "exp"


@pytest.mark.slow
def test_extending_a_run_continues_and_says_what_changes(corpus, tmp_path):
    """A larger --train-iters resumes (refused before); the GPT stream's change is one logged line;
    --exit-interval exits at a multiple of N (step 6 of 4..8, not at the first step past N)."""
    ckpt = tmp_path / "ckpt"
    common = ["--data-path", corpus[0], "--save", str(ckpt), "--load", str(ckpt), "--lr-decay-iters", "8"]
    pretrain(*common, "--train-iters", "4")
    metrics = tmp_path / "m.jsonl"
    proc = pretrain(*common, "--train-iters", "8", "--exit-interval", "3", "--metrics-file", str(metrics))
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [5, 6]
    assert "from step 5 on, samples are drawn from megatron's GPT shuffle of 64 samples" in proc.stderr
    # --no-load-optim: Adam and the LR schedule start fresh (warmup again: 2 steps from 0), the weights and step load
    fresh = tmp_path / "fresh.jsonl"
    pretrain(*common, "--train-iters", "8", "--no-load-optim", "--no-load-rng", "--metrics-file", str(fresh))
    records = [json.loads(line) for line in fresh.read_text().splitlines()]
    assert [r["step"] for r in records] == [7, 8] and records[0]["lr"] == pytest.approx(3e-3 / 2)


def test_the_loop_hands_the_start_up_signals_back():
    """Start-up exits at once on SIGTERM/SIGUSR1; once the loop runs only --exit-signal is caught,
    and a signal it does not name has its earlier handler again (not a silent exit 0)."""
    from megatron_fixedcode.training.loop import ExitRequest
    from megatron_fixedcode.utils.exit_signals import exit_at_once_until_training

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as under examples/slurm_node.sh
        exit_at_once_until_training()
        exit_at_once_until_training()  # the entry point and main() both install it
        assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_IGN
        request = ExitRequest(True)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == request._handle
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.slow  # ~40 s: the fast lane stays under 2 minutes
def test_kv_channels_rotary_percent_and_interleaving_reach_the_model(single_rank):
    """--kv-channels, --rotary-percent and --rotary-interleaved are megatron-core's TransformerConfig /
    GPTModel fields: 4 heads of 8 dims on a 64-wide model, RoPE on half of each head's dims."""
    import torch

    from megatron_fixedcode.models import build_gpt_model, build_transformer_config

    cfg = parse_pretrain_args(
        [
            *TINY,
            "--train-iters",
            "2",
            "--dry-run",
            "--kv-channels",
            "8",
            "--rotary-percent",
            "0.5",
            "--rotary-interleaved",
        ]
    )
    model_cfg = cfg.model_config(1024)
    assert (model_cfg.kv_channels, model_cfg.rotary_percent, model_cfg.rotary_interleaved) == (8, 0.5, True)
    config = build_transformer_config(model_cfg, cfg.layout, te_layers=False)
    assert (config.kv_channels, config.rotary_interleaved) == (8, True)
    torch.manual_seed(0)
    model = build_gpt_model(model_cfg, config, single_rank)
    layer = model.decoder.layers[0].self_attention
    assert tuple(layer.linear_qkv.weight.shape) == (3 * 4 * 8, 64) and tuple(layer.linear_proj.weight.shape) == (64, 32)
    assert model.rotary_pos_emb.inv_freq.numel() == 2  # 8 dims x 0.5 rotated, in pairs
    ids = torch.randint(0, 1024, (2, 32))
    assert model(ids, torch.arange(32).expand(2, -1), None).shape == (2, 32, 1024)
    # the default head width is hidden / heads, as Megatron-LM derives it
    assert parse_pretrain_args([*TINY, "--train-iters", "2", "--dry-run"]).model_config(1024).kv_channels is None


def test_megatron_virtual_pipeline_flags_set_the_interleaved_schedule(capsys):
    base = [*TINY, "--train-iters", "2", "--dry-run", "--num-layers", "8", "--pipeline-model-parallel-size", "2"]
    for extra, chunks in (
        (["--num-layers-per-virtual-pipeline-stage", "2"], 2),
        (["--num-virtual-stages-per-pipeline-rank", "4"], 4),
        (["--num-layers-per-virtual-pipeline-stage", "4"], None),
    ):  # one chunk: not interleaved
        cfg = parse_pretrain_args([*base, *extra])
        assert (cfg.args.virtual_pipeline_model_parallel_size, cfg.layout.virtual_pipeline_model_parallel_size) == (
            chunks,
            chunks,
        )
    assert "do not split into chunks of 3" in _refused([*base, "--num-layers-per-virtual-pipeline-stage", "3"], capsys)
    assert "give one of --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank" in _refused(
        [*base, "--num-layers-per-virtual-pipeline-stage", "2", "--num-virtual-stages-per-pipeline-rank", "2"], capsys
    )


def test_the_startup_line_names_only_the_inert_flags_given():
    """Values Megatron-LM's validate_args derives (p2p overlap off without interleaving, FP32 grad
    reduction under --bf16) are not reported as flags the user set."""
    cfg = parse_pretrain_args([*TINY, "--train-iters", "2", "--dry-run", "--bf16", "--log-world-size-to-tensorboard"])
    assert (cfg.args.overlap_p2p_comm, cfg.args.accumulate_allreduce_grads_in_fp32) == (False, True)
    assert cfg.inert == ["--log-world-size-to-tensorboard (the world size is in the startup lines)"]


def test_megatron_tokenizer_types_and_fp8_recipes_not_built_are_refused_in_one_line(capsys):
    from megatron_fixedcode.tokenizers.registry import TOKENIZER_TYPES
    from megatron_fixedcode.arguments.tokenizer_flags import TOKENIZER_NAMES

    assert TOKENIZER_NAMES == tuple(TOKENIZER_TYPES)
    base = [*TINY, "--train-iters", "2"]
    assert "--tokenizer-type TikTokenizer: TikToken vocabularies" in _refused(
        [*base, "--tokenizer-type", "TikTokenizer"], capsys
    )
    assert "--tokenizer-type BertWordPieceCase: BERT / T5: outside this project's scope" in _refused(
        [*base, "--tokenizer-type", "BertWordPieceCase", "--vocab-file", "v.txt"], capsys
    )
    assert "--fp8-recipe custom: custom FP8 quantizers: outside this project's scope" in _refused(
        [*base, "--fp8-recipe", "custom"], capsys
    )


@pytest.mark.slow
def test_mock_data_trains_on_megatrons_mock_dataset_and_resumes_exactly(tmp_path, capsys):
    """--mock-data as in the mock lines of Megatron-LM's Llama-3 example (NullTokenizer, --vocab-size): megatron-core's
    MockGPTDataset with its even 1,1,1 split, validation included; a stop and resume gives the losses of a straight
    run. Another data source beside it is refused in one line, as Megatron-LM's validate_args refuses it."""
    from megatron.core.datasets.gpt_dataset import MockGPTDataset

    from megatron_fixedcode.data.build import build_datasets
    from megatron_fixedcode.data.config import DataConfig
    from tests.helpers.pretrain import assert_same_steps

    mock = [
        "--mock-data",
        "--tokenizer-type",
        "NullTokenizer",
        "--train-iters",
        "6",
        "--eval-interval",
        "3",
        "--eval-iters",
        "1",
    ]
    pretrain(*mock, "--metrics-file", str(tmp_path / "straight.jsonl"))
    ckpt = str(tmp_path / "ckpt")
    pretrain(*mock, "--save", ckpt, "--exit-interval", "3", "--metrics-file", str(tmp_path / "resumed.jsonl"))
    pretrain(*mock, "--save", ckpt, "--load", ckpt, "--metrics-file", str(tmp_path / "resumed.jsonl"))
    straight, resumed = (read_metrics(tmp_path / f"{name}.jsonl") for name in ("straight", "resumed"))
    assert [r["step"] for r in resumed] == list(range(1, 7)) and resumed[2]["val_loss"] is not None
    assert_same_steps(straight, resumed)

    train, valid = build_datasets(
        DataConfig(data_path=[], mock=True, seq_length=32),
        types.SimpleNamespace(vocab_size=1024, eod=0, bos=None, pad=None, fingerprint="vocab1024"),
        num_train_samples=48,
        num_valid_samples=8,
        seed=1234,
    )
    assert isinstance(train, MockGPTDataset) and isinstance(valid, MockGPTDataset)
    tokens = train[0]["tokens"].tolist()  # megatron's mock documents: 1, 2, 3, ... then EOD
    assert any(b == a + 1 for a, b in zip(tokens, tokens[1:]))

    assert _dry_run([*TINY, *mock], capsys)["mock_data"] is True
    line = _refused([*TINY, *mock, "--data-path", "x"], capsys)
    assert "--mock-data is a data source of its own: drop --data-path" in line


@pytest.mark.slow
def test_decoupled_lr_schedules_the_output_layer_apart_and_resumes_exactly(tmp_path):
    """--decoupled-lr/--decoupled-min-lr (the Llama-3 example's): megatron-core's own parameter group for the input
    table and output layer (here the output layer: the code has no table), on the same warmup and decay with its
    own peak and floor; a stop and resume continues both exactly; a resume that adds or drops the group is refused
    in one line; at --decoupled-lr 0 the output layer keeps its initial weights while the blocks train."""
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint
    from tests.helpers.pretrain import assert_same_steps

    mock = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "4"]  # warmup 2, cosine to step 4
    decoupled = [*mock, "--decoupled-lr", "1e-2", "--decoupled-min-lr", "1e-3"]
    ckpt = str(tmp_path / "ckpt")
    pretrain(*decoupled, "--metrics-file", str(tmp_path / "straight.jsonl"))
    pretrain(*decoupled, "--save", ckpt, "--exit-interval", "2", "--metrics-file", str(tmp_path / "resumed.jsonl"))
    pretrain(*decoupled, "--save", ckpt, "--load", ckpt, "--metrics-file", str(tmp_path / "resumed.jsonl"))
    straight, resumed = (read_metrics(tmp_path / f"{name}.jsonl") for name in ("straight", "resumed"))
    assert_same_steps(straight, resumed)
    assert (
        [r["decoupled_lr"] for r in resumed]
        == [r["decoupled_lr"] for r in straight]
        == pytest.approx([5e-3, 1e-2, 1e-3 + 0.5 * 9e-3, 1e-3])
    )
    assert [r["lr"] for r in straight] == pytest.approx(
        [1.5e-3, 3e-3, 3e-4 + 0.5 * 2.7e-3, 3e-4]
    )  # --lr 3e-3, --min-lr 3e-4

    proc = pretrain(*mock, "--load", ckpt, check=False)  # without --decoupled-lr: Adam's groups would not match
    assert proc.returncode == 2 and "parameter groups differ" in proc.stderr.strip().splitlines()[-1]

    frozen = str(tmp_path / "frozen")
    pretrain(
        *mock,
        "--decoupled-lr",
        "0",
        "--decoupled-min-lr",
        "0",
        "--train-iters",
        "2",
        "--save",
        frozen,
        "--save-interval",
        "1",
    )
    first, second = (dict(load_megatron_checkpoint(frozen, step).model.named_parameters()) for step in (1, 2))
    assert torch.equal(first["output_layer.weight"], second["output_layer.weight"])
    assert not torch.equal(
        first["decoder.layers.0.mlp.linear_fc1.weight"], second["decoder.layers.0.mlp.linear_fc1.weight"]
    )


@pytest.mark.slow
def test_padded_vocab_size_sets_the_output_rows(tmp_path, capsys):
    """--padded-vocab-size (Megatron-LM's; its modelopt Qwen lists give it): the output layer has exactly that many
    rows; a resume without it is refused in one line; too few rows, or rows TP ranks cannot share, at parse time."""
    from megatron_fixedcode.checkpoint.single_process import saved_padded_vocab

    mock = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "2"]
    ckpt = tmp_path / "ckpt"
    pretrain(*mock, "--padded-vocab-size", "1040", "--save", str(ckpt))  # --vocab-size 1024, divisible by 8: 1024
    assert saved_padded_vocab(ckpt / "iter_0000002") == 1040
    proc = pretrain(*mock, "--load", str(ckpt), check=False)
    assert (
        proc.returncode == 2
        and "checkpoint has --padded-vocab-size 1040, this run None" in proc.stderr.splitlines()[-1]
    )
    assert _dry_run([*TINY, *mock, "--padded-vocab-size", "1040"], capsys)["padded_vocab_size"] == 1040
    assert "smaller than the vocabulary (1024)" in _refused([*TINY, *mock, "--padded-vocab-size", "1000"], capsys)
    line = _refused([*TINY, *mock, "--padded-vocab-size", "1041", "--tensor-model-parallel-size", "2"], capsys)
    assert "--padded-vocab-size 1041 must be a positive multiple of --tensor-model-parallel-size 2" in line
