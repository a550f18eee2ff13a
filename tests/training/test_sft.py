"""Paper 1's SFT continuation: the loss mask, the seeded stream, bad records, --finetune then an exact
resume through the trainer, and gold-answer / held-out response perplexity against a direct forward pass."""

import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from megatron_fixedcode.data.sft import (
    SFTDataError,
    SFTDataset,
    SFTFields,
    fit_to_window,
    load_sft_examples,
    read_sft_jsonl,
)
from tests.helpers.export import random_checkpoint
from tests.helpers import REPO, SMOLLM2_TOKENIZER
from tests.helpers.errors import refused
from tests.helpers.pretrain import TINY, pretrain, read_metrics, write_corpus


def char_tokenizer():
    """One id per character (ord), EOD 0: a mask can be checked by reading the ids."""
    return types.SimpleNamespace(tokenize=lambda s: [ord(c) for c in s], eod=0, pad=None, fingerprint="chars")


def write_jsonl(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_loss_mask_is_exactly_the_response_tokens(tmp_path):
    data = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"q": "2+2=", "a": "4!"},
            {
                "chat": [
                    {"role": "system", "content": "S"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                    {"role": "user", "content": "?"},
                    {"role": "assistant", "content": "ok"},
                ]
            },
        ],
    )
    fields = SFTFields(prompt="q", response="a", messages="chat")
    examples = read_sft_jsonl(data, fields, char_tokenizer().tokenize, 0)
    ds = SFTDataset(examples, seq_length=64, num_samples=2, seed=0, pad_id=0, shuffle=False)
    c = lambda s: [ord(x) for x in s]  # noqa: E731
    # (token ids, is-target) by hand: prompt no, response + its EOD yes.
    pair = [(i, 0) for i in c("2+2=")] + [(i, 1) for i in c("4!")] + [(0, 1)]
    chat = (
        [(i, 0) for i in c("System: S\nUser: hi\nAssistant:")]
        + [(i, 1) for i in c(" yo")]
        + [(0, 1)]
        + [(i, 0) for i in c("User: ?\nAssistant:")]
        + [(i, 1) for i in c(" ok")]
        + [(0, 1)]
    )
    for index, seq in enumerate((pair, chat)):
        ids = [i for i, _ in seq] + [0] * (65 - len(seq))
        target = [t for _, t in seq] + [0] * (65 - len(seq))
        sample = ds[index]
        assert sample["tokens"].tolist() == ids[:-1]
        assert sample["labels"].tolist() == ids[1:]
        assert sample["loss_mask"].tolist() == [float(t) for t in target[1:]]  # labels[j] is a response token
        assert sample["position_ids"].tolist() == list(range(64))
    assert set(ds[0]) == {"tokens", "labels", "loss_mask", "position_ids"}  # the GPT path's keys


def test_order_is_a_seeded_permutation_per_epoch_and_a_function_of_the_index(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(10)])
    ex = read_sft_jsonl(data, SFTFields(), char_tokenizer().tokenize, 0)
    a = SFTDataset(ex, seq_length=8, num_samples=30, seed=3, pad_id=0)
    order = [a.record_index(i) for i in range(30)]
    for epoch in range(3):
        assert sorted(order[10 * epoch : 10 * epoch + 10]) == list(range(10))
    assert order[:10] != order[10:20] and order[:10] != list(range(10))
    fresh = SFTDataset(ex, seq_length=8, num_samples=30, seed=3, pad_id=0)
    assert [fresh.record_index(i) for i in reversed(range(30))] == order[::-1]  # any access order
    assert [SFTDataset(ex, seq_length=8, num_samples=30, seed=4, pad_id=0).record_index(i) for i in range(30)] != order


def test_long_records_are_cut_at_the_right_and_responseless_ones_dropped(tmp_path):
    data = write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "ab", "response": "cdefgh"}, {"prompt": "abcdefghij", "response": "k"}]
    )
    ex = fit_to_window(read_sft_jsonl(data, SFTFields(), char_tokenizer().tokenize, 0), 4, "x")
    assert len(ex) == 1 and list(ex[0].ids) == [ord(x) for x in "abcde"] and list(ex[0].target) == [0, 0, 1, 1, 1]
    with pytest.raises(SFTDataError, match="no record has a response token"):
        fit_to_window(read_sft_jsonl(data, SFTFields(), char_tokenizer().tokenize, 0)[1:], 4, "x")


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"prompt": "x"}, "missing field 'response' (--sft-response-key)"),
        ({"prompt": "x", "response": "  "}, "empty 'response'"),
        ({"question": "x"}, "missing fields 'prompt' and 'response'"),
        ({"prompt": "x", "response": 3}, "field 'response' must be a string"),
        ('{"prompt": "x", ', "not valid JSON"),
        ({"messages": [{"role": "user", "content": "x"}]}, "no assistant message"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "message 0: role 'bot' is not one of"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]},
            "message 1: empty 'content'",
        ),
    ],
)
def test_bad_records_name_file_and_line(tmp_path, bad, message):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}, "", bad])
    with pytest.raises(SFTDataError) as err:
        read_sft_jsonl(data, SFTFields(), char_tokenizer().tokenize, 0)
    assert str(err.value).startswith(f"{data}:3: ") and message in str(err.value)


# --- through the trainer -------------------------------------------------------------------------

WORDS = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree", "river", "stone", "bird", "fish"]


def sft_records(n: int, offset: int = 0) -> list[dict]:
    """'what comes after W' → the next word of a fixed cycle; every third record is a chat."""
    out = []
    for i in range(offset, offset + n):
        w, nxt = WORDS[i % len(WORDS)], WORDS[(i + 1) % len(WORDS)]
        if i % 3 == 2:
            out.append(
                {"messages": [{"role": "user", "content": f"after {w}?"}, {"role": "assistant", "content": nxt}]}
            )
        else:
            out.append({"prompt": f"After {w} comes", "response": f" {nxt}."})
    return out


SFT_TINY = [*TINY, "--vocab-size", "49152", "--tokenizer-model", str(SMOLLM2_TOKENIZER)]


@pytest.mark.slow
def test_finetune_into_sft_then_resume_is_bit_identical(tmp_path):
    """Pretrain 1 step; SFT with --finetune (step 0, fresh optimizer) for 6 steps saving at 3; resume
    the SFT checkpoint at 3 (no --finetune): steps 4-6 equal. Step tokens = response targets."""
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus")
    pre = str(tmp_path / "pre")
    pretrain(
        *SFT_TINY,
        "--train-iters",
        "1",
        "--data-path",
        corpus[0],
        "--dataset-type",
        "document_windows",
        "--samples-per-shard-visit",
        "16",
        "--save",
        pre,
    )
    train = write_jsonl(tmp_path / "train.jsonl", sft_records(20))
    valid = write_jsonl(tmp_path / "valid.jsonl", sft_records(8, offset=100))
    common = [
        *SFT_TINY,
        "--dataset-type",
        "sft",
        "--train-data-path",
        train,
        "--valid-data-path",
        valid,
        "--train-iters",
        "6",
        "--eval-interval",
        "3",
        "--eval-iters",
        "1",
    ]
    sft = str(tmp_path / "sft")
    pretrain(
        *common,
        "--finetune",
        "--load",
        pre,
        "--save",
        sft,
        "--save-interval",
        "3",
        "--metrics-file",
        str(tmp_path / "straight.jsonl"),
    )
    pretrain(*common, "--load", sft, "--ckpt-step", "3", "--metrics-file", str(tmp_path / "resumed.jsonl"))
    straight, resumed = read_metrics(tmp_path / "straight.jsonl"), read_metrics(tmp_path / "resumed.jsonl")
    assert [r["step"] for r in straight] == [1, 2, 3, 4, 5, 6]  # --finetune starts at step 0
    assert [r["step"] for r in resumed] == [4, 5, 6]
    for b in resumed:
        a = straight[b["step"] - 1]
        assert (a["loss"], a["grad_norm"], a["lr"], a["tokens"], a.get("val_loss")) == (
            b["loss"],
            b["grad_norm"],
            b["lr"],
            b["tokens"],
            b.get("val_loss"),
        )
    # The trainer's targets per step are the response tokens (+ EOD) of that step's 8 records.
    from megatron_fixedcode.tokenizers import build_tokenizer

    tok = build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2_TOKENIZER))
    ds = SFTDataset(
        fit_to_window(load_sft_examples([train], SFTFields(), tok), 32, "t"),
        seq_length=32,
        num_samples=48,
        seed=1234,
        pad_id=tok.eod,
    )
    per_step = [int(sum(ds[i]["loss_mask"].sum() for i in range(8 * s, 8 * s + 8))) for s in range(6)]
    assert [r["step_tokens"] for r in straight] == per_step
    assert straight[-1]["val_loss"] < straight[2]["val_loss"] and math.isfinite(straight[-1]["val_loss"])


@pytest.mark.slow
def test_bad_record_stops_the_trainer_with_one_line_and_exit_2(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [*sft_records(3), {"prompt": "no answer"}])
    proc = pretrain(*SFT_TINY, "--dataset-type", "sft", "--data-path", train, "--train-iters", "1", check=False)
    refused(proc, f"{train}:4: missing field 'response' (--sft-response-key)")


# --- evaluation ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_gold_answer_and_response_perplexity_equal_a_direct_forward_pass(tmp_path):
    from megatron_fixedcode.checkpoint.single_process import load_megatron_checkpoint, megatron_logits
    from megatron_fixedcode.eval.gold_answer import squad_prompt
    from megatron_fixedcode.eval.run import checkpoint_target_perplexity
    from megatron_fixedcode.tokenizers import build_tokenizer

    src = random_checkpoint(
        tmp_path / "ckpt",
        input_embedding="binary",
        vocab_size=49152,
        seq_length=64,
        tokenizer_model=str(SMOLLM2_TOKENIZER),
    )
    tok = build_tokenizer("HuggingFaceTokenizer", str(SMOLLM2_TOKENIZER))
    rows = [
        {
            "context": "The Loire is the longest river in France.",
            "question": "Which river is longest?",
            "answers": {"text": ["The Loire", "Loire"], "answer_start": [0, 4]},
        },
        {"context": "Bees make honey.", "question": "What do bees make?", "answers": {"text": ["honey"]}},
        {"context": "Nothing here.", "question": "Who won?", "answers": {"text": []}},  # SQuAD 2.0: skipped
        {
            "context": "Water boils at 100 degrees Celsius at sea level.",
            "question": "At what temperature?",
            "answer": "100 degrees Celsius",
        },
    ]
    squad = write_jsonl(tmp_path / "squad.jsonl", rows)
    model = load_megatron_checkpoint(src).model

    def direct(pairs) -> float:  # one sequence at a time, no padding: sum of -log p(target | prefix)
        nll, n = 0.0, 0
        for prefix, target in pairs:
            ids = torch.tensor([prefix + target])
            logp = torch.log_softmax(megatron_logits(model, ids, 49152).double(), dim=-1)[0]
            nll -= sum(float(logp[len(prefix) + j - 1, t]) for j, t in enumerate(target))
            n += len(target)
        return nll / n

    expected = direct(
        [
            (tok.tokenize(squad_prompt(r["context"], r["question"])), tok.tokenize(" " + a))
            for r, a in ((rows[0], "The Loire"), (rows[1], "honey"), (rows[3], "100 degrees Celsius"))
        ]
    )
    proc = subprocess.run(
        [sys.executable, "tools/evaluate.py", "--load", str(src), "--squad", squad, "--batch-size", "2", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["task"] == "squad_gold_answer" and out["examples"] == 3 and out["unanswerable_skipped"] == 1
    assert out["loss"] == pytest.approx(expected, abs=1e-5) and out["ppl"] == pytest.approx(
        math.exp(expected), rel=1e-5
    )

    # Held-out SFT: the response tokens and their EOD, encoded as in training (a chat record included).
    valid = write_jsonl(tmp_path / "valid.jsonl", sft_records(3))
    got = checkpoint_target_perplexity(str(src), sft_data=[valid], batch_size=2)
    pairs = []
    for r in sft_records(3):
        if "messages" in r:
            prefix = tok.tokenize(f"User: {r['messages'][0]['content']}\n") + tok.tokenize("Assistant:")
            pairs.append((prefix, tok.tokenize(" " + r["messages"][1]["content"]) + [tok.eod]))
        else:
            pairs.append((tok.tokenize(r["prompt"]), tok.tokenize(r["response"]) + [tok.eod]))
    assert got["examples"] == 3 and got["loss"] == pytest.approx(direct(pairs), abs=1e-5)


def test_squad_file_errors_name_the_record(tmp_path):
    from megatron_fixedcode.eval.gold_answer import squad_examples

    bad = write_jsonl(
        tmp_path / "s.jsonl", [{"context": "c", "question": "q", "answer": "a"}, {"context": "c", "answers": []}]
    )
    with pytest.raises(ValueError, match=rf"{bad}:2: missing or empty field 'question'"):
        squad_examples(bad, char_tokenizer().tokenize)


def test_recipe_matches_the_paper1_model_and_passes_the_dry_run(capsys):
    import yaml

    from megatron_fixedcode.pretrain import main

    recipes = REPO / "examples" / "recipes"
    sft, base = (yaml.safe_load((recipes / n).read_text()) for n in ("paper1_sft.yaml", "paper1_0p4b_binary.yaml"))
    model_keys = (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "ffn_hidden_size",
        "seq_length",
        "normalization",
        "swiglu",
        "add_bias_linear",
        "position_embedding_type",
        "untie_embeddings_and_output_weights",
        "vocab_size",
        "make_vocab_size_divisible_by",
        "input_embedding",
        "code_impl",
        "code_scale",
        "tokenizer_model",
    )
    assert {k: sft[k] for k in model_keys} == {k: base[k] for k in model_keys}
    assert sft["dataset_type"] == "sft" and "finetune" not in sft and "load" not in sft
    assert main(["--config", str(recipes / "paper1_sft.yaml"), "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["dataset_type"] == "sft"


def test_squad_json_on_a_checkpoint_equals_jsonl_on_its_export(tmp_path):
    """SQuAD's own JSON layout and JSONL rows give the same examples; megatron and transformers agree."""
    pytest.importorskip("transformers")
    from megatron_fixedcode.eval.run import checkpoint_target_perplexity, hf_target_perplexity
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    src = random_checkpoint(
        tmp_path / "ckpt",
        input_embedding="gf2",
        vocab_size=49152,
        seq_length=64,
        tokenizer_model=str(SMOLLM2_TOKENIZER),
    )
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf")
    qas = [
        ("Bees make honey in hives.", "What do bees make?", "honey"),
        ("The Nile flows north into the Mediterranean Sea.", "Where does the Nile flow?", "into the Mediterranean Sea"),
    ]
    squad_json = tmp_path / "dev.json"
    squad_json.write_text(
        json.dumps(
            {
                "version": "1.1",
                "data": [
                    {
                        "title": "t",
                        "paragraphs": [
                            {
                                "context": c,
                                "qas": [{"id": str(i), "question": q, "answers": [{"text": a, "answer_start": 0}]}],
                            }
                            for i, (c, q, a) in enumerate(qas)
                        ],
                    }
                ],
            }
        )
    )
    squad_jsonl = write_jsonl(
        tmp_path / "dev.jsonl", [{"context": c, "question": q, "answers": {"text": [a]}} for c, q, a in qas]
    )
    a = checkpoint_target_perplexity(str(src), squad=str(squad_json))
    b = hf_target_perplexity(str(hf_dir), squad=squad_jsonl)
    assert a["examples"] == b["examples"] == 2 and a["tokens"] == b["tokens"] > 2
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    assert a["code_fingerprint"] == b["code_fingerprint"]


def test_sft_needs_a_tokenizer(capsys):
    from megatron_fixedcode.arguments.parse import parse_pretrain_args

    with pytest.raises(SystemExit) as err:
        parse_pretrain_args([*TINY, "--train-iters", "1", "--dataset-type", "sft", "--data-path", "x.jsonl"])
    assert (
        err.value.code == 2 and "--dataset-type sft tokenises text: give --tokenizer-model" in capsys.readouterr().err
    )
