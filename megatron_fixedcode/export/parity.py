"""An export proves itself: the same token ids through the trained model (megatron, TP=1, FP32) and
through the Hugging Face directory loaded with plain ``transformers`` (FP32 compute), compared.

The tokens, in this order: a fixed sample of the run's validation data (the first tokens of its
validation documents, read from the ``.bin``/``.idx`` the checkpoint names), a built-in English
text tokenized with the checkpoint's tokenizer, or fixed-seed random ids (no tokenizer). The
report (``parity.json`` in the export) gives max |Δlogit|, the mean next-token NLL of both models,
|ΔNLL|, next-token (argmax) agreement, the ids and their source, and ``passed`` against
:data:`THRESHOLDS` (docs/export.md says why these values).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from megatron_fixedcode.data.config import is_blend_weight

logger = logging.getLogger(__name__)
REPORT_FILE = "parity.json"
NUM_SEQUENCES = 2
MAX_TOKENS = 128  # per sequence (at most the model's sequence length)
RANDOM_SEED = 0
# Per export dtype: max |Δlogit| <= logit_rel * max(1, max |logit|) and |ΔNLL| <= nll_rel * max(1, NLL).
# float32 exports measure ~1e-7 relative; bfloat16/float16 ones only round the weights (the check
# computes in FP32) and measure up to ~1e-2 / ~2e-3 relative on logits.
THRESHOLDS = {
    "float32": {"logit_rel": 1e-3, "nll_rel": 1e-3},
    "bfloat16": {"logit_rel": 0.1, "nll_rel": 0.02},
    "float16": {"logit_rel": 0.02, "nll_rel": 0.005},
}
BUILTIN_TEXT = (
    "The history of the English language began with the arrival of three Germanic tribes who invaded "
    "Britain during the fifth century. Old English did not sound or look like the English spoken today; "
    "native speakers would have great difficulty understanding it. In 1066 William the Conqueror invaded "
    "and conquered England, and the new conquerors brought a kind of French, which became the language of "
    "the royal court and of the ruling and business classes. Modern English began towards the end of "
    "Shakespeare's time, when a sudden and distinct change in pronunciation started, and the invention of "
    "printing meant that there was now a common language in print. Books became cheaper, more people learned "
    "to read, and spelling and grammar became fixed. Today a person who reads a newspaper, writes a letter to "
    "a friend, or looks up the weather for tomorrow uses words from all of these times at once.\n"
)


class ParityFailed(Exception):
    """The export does not compute what the checkpoint computes (the report says by how much)."""

    def __init__(self, report: dict[str, Any]):
        super().__init__(summary(report))
        self.report = report


def _split_start(split: str | None, num_docs: int) -> int:
    """The first document of the validation part of ``--split`` (megatron's rounding of the weights)."""
    try:
        weights = [float(w) for w in str(split or "").replace("/", ",").split(",") if w.strip()]
    except ValueError:
        return 0
    if len(weights) < 2 or sum(weights) <= 0:
        return 0
    return round(weights[0] / sum(weights) * num_docs)


def validation_ids(trainer_state: dict[str, Any], num_tokens: int, vocab_size: int) -> tuple[np.ndarray, str] | None:
    """``num_tokens`` ids from the start of the run's validation data, or None when the checkpoint
    names none or its files are gone. A ``--valid-data-path`` blend is read from its first document;
    a ``--data-path`` blend from the first document of the ``--split`` validation part."""
    from megatron_fixedcode.data.indexed_format import read_array, read_header

    if trainer_state.get("mock_data"):
        return None
    own_valid = trainer_state.get("valid_data_path")
    blend = own_valid or trainer_state.get("data_path") or []
    split = None if own_valid else (trainer_state.get("run_config") or {}).get("split")
    for prefix in (p for p in blend if isinstance(p, str) and not is_blend_weight(p)):
        idx, bin_path = prefix + ".idx", prefix + ".bin"
        if not (os.path.isfile(idx) and os.path.isfile(bin_path)):
            continue
        try:
            header = read_header(idx)
            docs = read_array(idx, header, "documents")
            first_doc = _split_start(split, len(docs) - 1) if split else 0
            if first_doc >= len(docs) - 1:  # no validation part: the data's first document
                first_doc = 0
            sequence = int(docs[first_doc])
            if sequence >= header.num_sequences:
                continue
            pointer = int(read_array(idx, header, "pointers", sequence, 1)[0])
            ids = np.fromfile(bin_path, dtype=header.dtype, count=num_tokens, offset=pointer)
        except (ValueError, OSError) as e:
            logger.warning("parity check: %s unreadable (%s); trying the next source", prefix, e)
            continue
        if len(ids) == num_tokens and int(ids.max()) < vocab_size and int(ids.min()) >= 0:
            where = "the --split validation part of" if split else "the validation data"
            return ids.astype(np.int64), f"{where} {prefix} (document {first_doc})"
    return None


def builtin_text_ids(tokenizer: Any, num_tokens: int, vocab_size: int) -> tuple[np.ndarray, str] | None:
    ids = list(tokenizer.tokenize(BUILTIN_TEXT))
    if not ids or max(ids) >= vocab_size:
        return None
    while len(ids) < num_tokens:
        ids = ids + ids
    source = "the built-in English text, tokenized by the checkpoint's tokenizer"
    return np.asarray(ids[:num_tokens], dtype=np.int64), source


def parity_tokens(
    trainer_state: dict[str, Any], tokenizer: Any, vocab_size: int, seq_length: int
) -> tuple[torch.Tensor, str]:
    """``[B, S]`` ids (B=2, S=min(seq_length, 128)) and where they came from."""
    length = min(seq_length, MAX_TOKENS)
    total = NUM_SEQUENCES * length
    found = validation_ids(trainer_state, total, vocab_size)
    if found is None and tokenizer is not None:
        found = builtin_text_ids(tokenizer, total, vocab_size)
    if found is None:
        g = torch.Generator().manual_seed(RANDOM_SEED)
        ids = torch.randint(0, vocab_size, (NUM_SEQUENCES, length), generator=g)
        return ids, f"fixed-seed random ids (seed {RANDOM_SEED}; no validation data or tokenizer)"
    ids, source = found
    return torch.from_numpy(ids).reshape(NUM_SEQUENCES, length), source


def compare_logits(ref_BSV: torch.Tensor, got_BSV: torch.Tensor, ids_BS: torch.Tensor, dtype: str) -> dict[str, Any]:
    """The report's numbers and ``passed`` for the export dtype's thresholds."""
    if ref_BSV.shape != got_BSV.shape:
        return {"passed": False, "error": f"logits of shape {list(got_BSV.shape)}, expected {list(ref_BSV.shape)}"}
    ref, got = ref_BSV.double(), got_BSV.double()
    targets = ids_BS[:, 1:].reshape(-1)

    def nll(logits: torch.Tensor) -> float:
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), targets).item()

    nll_ref, nll_got = nll(ref), nll(got)
    diff = (got - ref).abs().max().item()
    scale = ref.abs().max().item()
    limits = THRESHOLDS[dtype]
    finite = bool(torch.isfinite(got).all())
    logit_ok = finite and diff <= limits["logit_rel"] * max(1.0, scale)
    nll_ok = finite and abs(nll_got - nll_ref) <= limits["nll_rel"] * max(1.0, nll_ref)
    return {
        "passed": bool(logit_ok and nll_ok),
        "max_abs_logit_diff": diff,
        "max_abs_logit": scale,
        "mean_nll_megatron": nll_ref,
        "mean_nll_hf": nll_got,
        "abs_nll_diff": abs(nll_got - nll_ref),
        "next_token_agreement": (ref.argmax(-1) == got.argmax(-1)).double().mean().item(),
        "threshold": {
            **limits,
            "rule": "max_abs_logit_diff <= logit_rel * max(1, max_abs_logit) and "
            "abs_nll_diff <= nll_rel * max(1, mean_nll_megatron)",
        },
    }


def hf_model_logits(hf_dir: str | Path, ids_BS: torch.Tensor, trust_remote_code: bool = False) -> torch.Tensor:
    """Logits of the export loaded with plain ``transformers`` in FP32 (weights upcast from the export dtype)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(hf_dir), dtype=torch.float32, trust_remote_code=trust_remote_code
    ).eval()
    with torch.no_grad():
        logits = model(ids_BS).logits.float()
    del model
    return logits


def check_export(ckpt: Any, hf_dir: str | Path, tokenizer: Any = None) -> dict[str, Any]:
    """The parity report of ``hf_dir`` against a :class:`LoadedCheckpoint` (not written)."""
    from megatron_fixedcode.checkpoint.single_process import megatron_logits
    from megatron_fixedcode.export import hf_io

    hf_dir = Path(hf_dir)
    config = hf_io.read_config(hf_dir)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    if dtype not in THRESHOLDS:
        raise ValueError(f"{hf_dir}/config.json: dtype {dtype!r} is not one this project exports")
    cfg = ckpt.model_cfg
    seq_length = min(cfg.seq_length, int(config.get("n_positions") or config.get("max_position_embeddings") or 1 << 30))
    ids, source = parity_tokens(ckpt.trainer_state, tokenizer, cfg.vocab_size, seq_length)
    ref = megatron_logits(ckpt.model, ids, cfg.vocab_size)
    got = hf_model_logits(hf_dir, ids, trust_remote_code=bool(config.get("auto_map")))
    report = compare_logits(ref, got, ids, dtype)
    import transformers

    report.update(
        export_dtype=dtype,
        compute_dtype="float32",
        architecture=(config.get("architectures") or ["?"])[0],
        checkpoint=str(ckpt.path),
        step=ckpt.step,
        transformers_version=transformers.__version__,
        tokens={"source": source, "shape": list(ids.shape), "ids": ids.tolist()},
    )
    return report


def summary(report: dict[str, Any]) -> str:
    """One line: verdict, the numbers, the token source."""
    if "error" in report:
        return f"parity check FAILED: {report['error']}"
    verdict = "passed" if report["passed"] else "FAILED"
    return (
        f"parity check {verdict} ({report.get('export_dtype', '?')} export, {report.get('architecture', '?')}): "
        f"max |dlogit| {report['max_abs_logit_diff']:.3g} (max |logit| {report['max_abs_logit']:.3g}), "
        f"NLL {report['mean_nll_megatron']:.5f} megatron vs {report['mean_nll_hf']:.5f} HF, next-token "
        f"agreement {report['next_token_agreement']:.1%}, on {report['tokens']['shape'][0]}x"
        f"{report['tokens']['shape'][1]} tokens of {report['tokens']['source']}"
    )


def write_report(hf_dir: str | Path, report: dict[str, Any]) -> Path:
    """``HF_DIR/parity.json``, replaced whole (a temporary file renamed)."""
    path = Path(hf_dir) / REPORT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def checkpoint_tokenizer(ckpt: Any, tokenizer_model: str | None = None) -> Any:
    """The checkpoint's tokenizer: ``tokenizer_model`` if given (the same tokenizer, checked), else the
    copy the checkpoint carries, else its recorded path; None when it names none or its files are
    gone (the check then uses validation data or random ids)."""
    from megatron_fixedcode.tokenizers import build_tokenizer, checkpoint_tokenizer_files

    record = ckpt.trainer_state.get("tokenizer") or {}
    try:
        model, merge_file = checkpoint_tokenizer_files(
            record,
            ckpt.path.parent,
            f"--load {ckpt.path.parent}",
            tokenizer_model,
            (ckpt.trainer_state.get("identity") or {}).get("tokenizer_fingerprint"),
        )
    except ValueError:
        if tokenizer_model:
            raise  # another tokenizer than the checkpoint's: refused, not silently ignored
        return None
    if not model:
        return None
    return build_tokenizer(record.get("type") or "HuggingFaceTokenizer", model, merge_file=merge_file)


def verify_export(ckpt: Any, hf_dir: str | Path, tokenizer: Any = None, report_path: str | Path | None = None) -> dict:
    """Check ``hf_dir`` against ``ckpt`` and write the report (``HF_DIR/parity.json`` unless
    ``report_path``); :class:`ParityFailed` (the report attached) when it does not pass."""
    report = check_export(ckpt, hf_dir, tokenizer)
    if report_path is None:
        write_report(hf_dir, report)
    else:
        Path(report_path).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    if not report["passed"]:
        raise ParityFailed(report)
    return report
