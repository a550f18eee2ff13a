"""SQuAD gold-answer perplexity (paper 1 after SFT): readers for the official JSON and JSONL, and
the value against a hand computation on a tiny model."""
import json
import math

import pytest
import torch

from megatron_fixedcode.eval.gold_answer import PROMPT, encode, gold_answer_nll, read_squad
from tests.export_helpers import random_checkpoint

SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
    {"context": "Ada wrote the first program.", "qas": [
        {"id": "q1", "question": "Who wrote it?", "answers": [{"text": "Ada", "answer_start": 0}, {"text": "Ada L.", "answer_start": 0}]},
        {"id": "q2", "question": "What did she write?", "answers": [{"text": "the first program", "answer_start": 9}]},
        {"id": "q3", "question": "When?", "answers": [], "is_impossible": True}]}]}]}


def tokenize(text: str) -> list[int]:  # one id per character, inside the tiny model's vocabulary
    return [1 + ord(ch) % 900 for ch in text]


def test_readers_take_the_first_gold_answer_and_skip_unanswerable(tmp_path):
    (tmp_path / "dev.json").write_text(json.dumps(SQUAD))
    triples, skipped = read_squad(tmp_path / "dev.json")
    assert triples == [("Ada wrote the first program.", "Who wrote it?", "Ada"),
                       ("Ada wrote the first program.", "What did she write?", "the first program")] and skipped == 1
    lines = [{"context": c, "question": q, "answers": {"text": [a], "answer_start": [0]}} for c, q, a in triples]
    (tmp_path / "dev.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert read_squad(tmp_path / "dev.jsonl") == (triples, 0)
    with pytest.raises(ValueError, match="not SQuAD JSON"):
        (tmp_path / "bad.json").write_text("[1, 2]")
        read_squad(tmp_path / "bad.json")


def test_gold_answer_perplexity_equals_a_hand_computation(tmp_path):
    from megatron_fixedcode.eval.perplexity import megatron_logits_fn
    from megatron_fixedcode.export import load_megatron_checkpoint

    ckpt = load_megatron_checkpoint(random_checkpoint(tmp_path / "ckpt", input_embedding="gf2"))
    logits_fn = megatron_logits_fn(ckpt.model, ckpt.model_cfg.vocab_size)
    (tmp_path / "dev.json").write_text(json.dumps(SQUAD))
    triples, _ = read_squad(tmp_path / "dev.json")
    pairs = encode(triples, tokenize, eod=0)
    got = gold_answer_nll(logits_fn, pairs, seq_length=128, eod=0, batch_size=2)

    nll, count = 0.0, 0  # one question at a time, no padding: -log p(answer token | everything before it)
    for c, q, a in triples:
        prompt, answer = [0, *tokenize(PROMPT.format(context=c, question=q))], tokenize(" " + a)
        seq = torch.tensor([prompt + answer])
        logp = torch.log_softmax(logits_fn(seq[:, :-1]).double(), dim=-1)[0]
        for k, token in enumerate(answer):
            nll -= float(logp[len(prompt) - 1 + k, token])
            count += 1
    assert got["answer_tokens"] == count == len(" Ada") + len(" the first program")
    assert got["loss"] == pytest.approx(nll / count, abs=1e-6) and got["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-6)
    assert got["truncated"] == 0
    short = gold_answer_nll(logits_fn, pairs, seq_length=24, eod=0)  # prompts cut from the left
    assert short["truncated"] == 2 and short["answer_tokens"] == count


def test_cli_checkpoint_and_export_give_the_same_gold_answer_perplexity(tmp_path):
    import os
    import subprocess
    import sys

    from megatron_fixedcode.export import convert_checkpoint_to_hf
    from tests.export_helpers import SMOLLM2_TOKENIZER
    from tests.helpers import REPO

    if not SMOLLM2_TOKENIZER.exists():
        pytest.skip("shared data absent")
    pytest.importorskip("transformers")
    src = random_checkpoint(tmp_path / "ckpt", input_embedding="binary", vocab_size=49152, hidden_size=32,
                            num_attention_heads=2, ffn_hidden_size=64, num_layers=1, seq_length=128,
                            tokenizer_model=str(SMOLLM2_TOKENIZER))
    hf_dir = convert_checkpoint_to_hf(src, tmp_path / "hf")
    (tmp_path / "dev.json").write_text(json.dumps(SQUAD))

    def evaluate(*args):
        out = subprocess.run([sys.executable, "tools/evaluate.py", *args, "--squad", str(tmp_path / "dev.json"), "--json"],
                             cwd=REPO, capture_output=True, text=True, timeout=300,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout)

    a, b = evaluate("--load", str(src)), evaluate("--hf-model", str(hf_dir))
    assert a["answers"] == b["answers"] == 2 and a["unanswerable_skipped"] == 1
    assert a["answer_tokens"] == b["answer_tokens"] > 2 and a["loss"] == pytest.approx(b["loss"], abs=1e-5)
