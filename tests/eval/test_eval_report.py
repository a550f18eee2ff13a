"""Seed aggregation and report tables against hand-computed numbers."""

import pytest

from megatron_fixedcode.eval import compare, comparison_markdown, model_markdown, seed_summary


def _run(label, seed, acc, acc_norm, **extra):
    return {
        "label": label,
        "seed": seed,
        **extra,
        "results": {"piqa_local@0shot": {"acc": acc, "acc_stderr": 0.01, "acc_norm": acc_norm, "sample_len": 10}},
    }


def test_seed_summary_by_hand():
    s = seed_summary([2.40, 2.36, 2.50])
    assert s["mean"] == pytest.approx(2.42) and s["n"] == 3
    assert s["relative_range"] == pytest.approx(0.14 / 2.42)  # (max - min) / mean = 5.785%


def test_comparison_keeps_acc_and_acc_norm_apart_and_lists_references():
    runs = [
        _run("binary", 1, 0.70, 0.72),
        _run("binary", 2, 0.68, 0.74),
        _run("learned", 1, 0.60, 0.61),
        _run("SmolLM2-135M", None, 0.65, 0.66, reference=True),
        {"label": "binary", "seed": 1, "loss": 2.0, "ppl": 7.389},
    ]
    table = compare(runs)
    b = table["models"]["binary"]
    assert b["piqa_local@0shot/acc"]["mean"] == pytest.approx(0.69)
    assert b["piqa_local@0shot/acc"]["relative_range"] == pytest.approx(0.02 / 0.69)
    assert b["piqa_local@0shot/acc_norm"]["mean"] == pytest.approx(0.73)
    assert b["validation/loss"]["n"] == 1 and "piqa_local@0shot/sample_len" not in b
    assert table["references"] == {"SmolLM2-135M": {"piqa_local@0shot/acc": 0.65, "piqa_local@0shot/acc_norm": 0.66}}
    md = comparison_markdown(table)
    assert "| metric | binary | learned | SmolLM2-135M (ref) |" in md
    assert "| piqa_local@0shot/acc | 0.6900 (range 2.9%, n=2) | 0.6000 (range 0.0%, n=1) | 0.6500 |" in md
    single = model_markdown(runs[0])
    assert "| piqa_local@0shot | acc | 0.7000 | 0.0100 |" in single and "acc_norm | 0.7200" in single


def _audited(label, seed, hashes):
    run = _run(label, seed, 0.7, 0.7)
    run["requests"] = {
        task: {"requests": 10, "sha256": h, "truncated": 1, "max_length": 2048} for task, h in hashes.items()
    }
    return run


def test_comparison_flags_tasks_whose_request_sets_differ():
    same = {"piqa_local@0shot": "a" * 64, "mmlu@5shot": "b" * 64}
    runs = [
        _audited("binary", 1, same),
        _audited("gf2", 1, same),
        _run("learned", 1, 0.6, 0.6),
    ]  # no audit: not compared
    table = compare(runs)
    assert table["differing_request_sets"] == {}
    assert "Request sets differ" not in comparison_markdown(table)
    runs.append(_audited("learned", 2, {"piqa_local@0shot": "a" * 64, "mmlu@5shot": "c" * 64}))
    table = compare(runs)
    assert table["differing_request_sets"] == {
        "mmlu@5shot": {"binary (seed 1)": "b" * 64, "gf2 (seed 1)": "b" * 64, "learned (seed 2)": "c" * 64}
    }
    md = comparison_markdown(table)
    assert "**Request sets differ**" in md and f"* mmlu@5shot: binary (seed 1) {'b' * 16}" in md
    assert "| mmlu@5shot | 10 | 1 (context 2048) | " + "b" * 16 + " |" in model_markdown(runs[0])


def test_request_audit_hashes_the_request_set_and_counts_truncation_by_hand():
    Instance = pytest.importorskip("lm_eval.api.instance").Instance
    from megatron_fixedcode.eval.audit import RequestAudit

    class WordLM:  # one token per word; context 4 tokens
        max_length, prefix_token_id = 4, 0

        def tok_encode(self, text):
            return text.split()

        def _encode_pair(self, context, continuation):
            return self.tok_encode(context), self.tok_encode(continuation)

        def loglikelihood(self, requests):
            return [(0.0, True)] * len(requests)

    def inst(args, doc_id, idx=0, task="t"):
        return Instance(request_type="loglikelihood", doc={}, arguments=args, idx=idx, metadata=(task, doc_id, 1))

    lm = WordLM()
    audit = RequestAudit(lm)
    # fed lengths (context + continuation - 1): 3 and 4 fit, 5 is cut, 1 + 1 - 1 = 1 (empty context: the prefix token)
    requests = [
        inst(("a b c", " d"), 0),
        inst(("a b c", " d e"), 0, idx=1),
        inst(("a b c", " d e f"), 0, idx=2),
        inst(("", " x"), 1),
    ]
    assert lm.loglikelihood(requests) == [(0.0, True)] * 4
    first = audit.summary()["t"]
    assert (first["requests"], first["truncated"], first["max_length"]) == (4, 1, 4)
    audit.reset()
    lm.loglikelihood(list(reversed(requests)))  # the same set in another order: the same hash
    assert audit.summary()["t"]["sha256"] == first["sha256"]
    audit.reset()
    lm.loglikelihood([*requests[:3], inst(("", " y"), 1)])  # one request changed
    assert audit.summary()["t"]["sha256"] != first["sha256"]
