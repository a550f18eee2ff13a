"""Evaluation where the user evaluates: ``--device`` (default: CUDA when torch sees a GPU),
``--dtype`` and ``--batch-size`` reach the perplexity and the harness paths, and the log-probabilities
are reduced in float64 a chunk at a time, never as a float64 copy of the whole ``[B, S, V]`` batch."""

import json
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from megatron_fixedcode.eval import perplexity
from tests.helpers.export import random_checkpoint
from tests.helpers import ASSETS, SMOLLM2_TOKENIZER
from tests.helpers import REPO


class LargestFloat64(TorchDispatchMode):
    """The bytes of the largest float64 tensor any torch op produced inside the block."""

    def __init__(self):
        super().__init__()
        self.max_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                self.max_bytes = max(self.max_bytes, t.numel() * 8)
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nll_is_float64_exact_without_a_float64_batch(monkeypatch, dtype):
    monkeypatch.setattr(perplexity, "NLL_CHUNK_BYTES", 1 << 20)  # 1 MiB: ~40 positions of V = 3000
    g = torch.Generator().manual_seed(0)
    B, S, V = 4, 96, 3000
    logits_BSV = (4 * torch.randn(B, S, V, generator=g)).to(dtype)
    docs = [torch.randint(1, V, (S - 1 - 7 * b,), generator=g).tolist() for b in range(B)]  # ragged: padding
    seen = []

    def logits_fn(ids_BS):
        seen.append(ids_BS)
        return logits_BSV[: ids_BS.shape[0], : ids_BS.shape[1]]

    with LargestFloat64() as mode:
        out = perplexity.document_nll(logits_fn, docs, seq_length=S, eod=0, batch_size=B)
    assert mode.max_bytes <= 1 << 20 < B * S * V * 8  # the whole batch in float64 would be 9.2 MB
    # the reference: one float64 cross-entropy over the batch, as before
    tgt_BS = torch.full((B, S), -100)
    for b, doc in enumerate(docs):
        tgt_BS[b, : len(doc)] = torch.tensor(doc)
    ref = torch.nn.functional.cross_entropy(
        logits_BSV.double().flatten(0, 1), tgt_BS.flatten(), ignore_index=-100, reduction="sum"
    )
    assert len(seen) == 1 and out["tokens"] == int((tgt_BS != -100).sum())
    assert out["loss"] == pytest.approx(float(ref) / out["tokens"], rel=1e-13)


def test_default_device_is_cuda_when_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert perplexity.default_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert perplexity.default_device() == "cpu"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    pytest.importorskip("transformers")
    from megatron_fixedcode.export import convert_checkpoint_to_hf

    root = tmp_path_factory.mktemp("device")
    src = random_checkpoint(
        root / "ckpt",
        input_embedding="gf2",
        vocab_size=49152,
        hidden_size=32,
        num_attention_heads=2,
        ffn_hidden_size=64,
        num_layers=1,
        seq_length=128,
        tokenizer_model=str(SMOLLM2_TOKENIZER),
    )
    return src, convert_checkpoint_to_hf(src, root / "hf")


def _evaluate(*args, code=0):
    proc = subprocess.run(
        [sys.executable, "tools/evaluate.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert proc.returncode == code, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_evaluate_device_dtype_and_batch_size(export):
    ckpt, hf = export
    text = str(ASSETS / "corpus" / "state_union" / "1945-Truman.txt")
    common = ["--text-files", text, "--max-tokens", "300", "--json"]
    full = json.loads(_evaluate("--hf-model", str(hf), "--device", "cpu", "--batch-size", "1", *common).stdout)
    half = json.loads(
        _evaluate("--hf-model", str(hf), "--device", "cpu", "--dtype", "bfloat16", "--batch-size", "3", *common).stdout
    )
    assert (full["device"], full["dtype"], half["device"], half["dtype"]) == ("cpu", "float32", "cpu", "bfloat16")
    assert half["tokens"] == full["tokens"] and half["loss"] == pytest.approx(full["loss"], rel=0.02)
    mega = json.loads(_evaluate("--load", str(ckpt), "--device", "cpu", *common).stdout)
    assert mega["device"] == "cpu" and mega["loss"] == pytest.approx(full["loss"], abs=1e-5)
    refused = _evaluate("--load", str(ckpt), "--dtype", "bfloat16", *common, code=2)
    assert (
        refused.stderr.startswith("error: --dtype bfloat16 applies to --hf-model")
        and len(refused.stderr.strip().splitlines()) == 1
    )


@pytest.mark.slow
def test_harness_gets_device_dtype_and_batch_size(export, monkeypatch):
    """run_harness hands lm-eval the user's device (default CUDA when seen), dtype and batch size."""
    pytest.importorskip("lm_eval")
    import lm_eval.api.registry as registry

    from megatron_fixedcode.eval.harness import run_harness

    seen = {}

    class Stop(Exception):
        pass

    class FakeHF:
        @staticmethod
        def create_from_arg_obj(model_args, extra):
            seen.update(model_args=model_args, extra=extra)
            raise Stop

    monkeypatch.setattr(registry, "get_model", lambda name: FakeHF)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(Stop):
        run_harness(export[1], "local", batch_size=5, dtype="bfloat16")
    assert seen["extra"] == {"batch_size": 5, "device": "cuda"} and seen["model_args"]["dtype"] == "bfloat16"
    with pytest.raises(Stop):
        run_harness(export[1], "local", device="cpu")
    assert seen["extra"]["device"] == "cpu" and seen["model_args"]["dtype"] == "float32"
    with pytest.raises(ValueError, match="--dtype 'float64'"):
        run_harness(export[1], "local", dtype="float64")


@pytest.mark.slow
def test_eval_memory_benchmark_runs():
    """benchmarks/eval_memory.py --smoke: both reductions, the same sum, the chunked one smaller."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/eval_memory.py", "--smoke", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    before, after = r["variants"]["before"], r["variants"]["after"]
    assert r["nll_relative_difference"] < 1e-12
    assert (
        after["tensor_peak_bytes"] < before["tensor_peak_bytes"]
        and before["tensor_peak_bytes"] >= 2 * before["logits_bytes"] * 2
    )
