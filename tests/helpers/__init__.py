"""Shared test helpers: launching torchrun workers and locating the test data (tests/assets)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``script`` under ``torchrun --nproc_per_node nproc`` on gloo (its ranks forked from a pre-imported
    server: tests/helpers/rank_launch.py); fail with its output."""
    from tests.helpers.rank_launch import forked_ranks_wanted, run_ranks

    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    if forked_ranks_wanted():
        proc = run_ranks(list(args), nproc=nproc, env=env, cwd=REPO, timeout=timeout, script=script)
        if proc.returncode != 0:
            raise AssertionError(
                f"{script} on {nproc} forked ranks failed ({proc.returncode}):\n"
                f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
            )
        return proc
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--standalone",
        str(script),
        *args,
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


def skip_unless_kernel_builds(kernel: str) -> None:
    """``kernel="fused"`` needs the compiled CPU kernel (a C++ compiler and ninja, built on first
    use); where it cannot be built, the torch path is what runs, and these cases skip."""
    import pytest

    from megatron_fixedcode.kernels import fixed_code_cpu_kernel

    if kernel == "fused" and fixed_code_cpu_kernel() is None:
        pytest.skip("the fused CPU kernel cannot be built here (no C++ compiler or ninja)")


ASSETS = REPO / "tests" / "assets"  # the data the tests read, with its sources: tests/assets/SOURCES.md
SMOLLM2 = ASSETS / "tokenizers" / "smollm2"  # the SmolLM2 tokenizer (its tokenizer.json)
SMOLLM2_TOKENIZER = SMOLLM2 / "tokenizer.json"


def write_gpt2_bpe_files(out: Path, vocab_size: int = 1000) -> tuple[Path, Path]:
    """A GPT-2-format ``vocab.json`` + ``merges.txt`` (``#version`` header, ``<|endoftext|>`` the last
    id as in GPT-2's): a byte-level BPE trained with HF ``tokenizers`` on a book of tests/assets."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    book = ASSETS / "corpus" / "gutenberg" / "pg11-0.txt"
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train(
        [str(book)],
        trainers.BpeTrainer(
            vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tok.model.save(str(out))
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    vocab["<|endoftext|>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return out / "vocab.json", out / "merges.txt"
