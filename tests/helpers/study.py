"""Records and evaluation results of the paper-2 study, as its stages write them."""


def study_record(variant: str, **over) -> dict:
    """A study run's record (what study.stages writes after training), fields overridden by ``over``."""
    rec = {
        "variant": variant,
        "recipe": "r.yaml",
        "input_embedding": variant,
        "step": 4,
        "planned_steps": 4,
        "tokens": 2048,
        "config_hash": "c" * 64,
        "data_manifest_fingerprint": "d" * 64,
        "tokenizer_fingerprint": "t" * 16,
        "eval_protocol_hash": "e" * 64,
    }
    return {**rec, **over}


def study_result(acc: float, sha: str = "a" * 64, truncated: int = 0) -> dict:
    """An evaluation result of two local tasks as the harness writes it."""
    return {
        "results": {
            "piqa_local@0shot": {
                "acc": acc,
                "acc_stderr": 0.1,
                "acc_norm": acc + 0.01,
                "acc_norm_stderr": 0.11,
                "sample_len": 4,
            },
            "lambada_local@0shot": {"perplexity": 900.0, "perplexity_stderr": 50.0, "acc": 0.0},
        },
        "requests": {"piqa_local@0shot": {"requests": 8, "sha256": sha, "truncated": truncated, "max_length": 64}},
    }
