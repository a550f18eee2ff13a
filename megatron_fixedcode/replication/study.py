"""The study as data: the runs, their trainer flags, and the identity (config hash) of each run.

A run is one (variant, seed). Its config hash covers everything that decides its numbers — the
recipe, the variant's flags, the seed, the step count, the tokenizer and the indexed data (by
content), the evaluation budget — and nothing that does not (paths, the machine, the date), so a
finished run is recognized in a later sitting and skipped, and a changed recipe is not mistaken for
a finished one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import yaml

from megatron_fixedcode.codes import PAPER_CODE_SEED

RECIPES = Path(__file__).resolve().parents[1] / "recipes"

VARIANTS: dict[str, tuple[list[str], str]] = {  # name -> (trainer flags, what it controls for)
    "learned": (["--input-embedding", "learned"], "the baseline: a trainable V×d table"),
    "binary": (["--input-embedding", "binary"], "the K-bit id, tiled"),
    "gf2": (
        ["--input-embedding", "gf2", "--code-seed", str(PAPER_CODE_SEED)],
        f"the bits recoded by this project's GF(2) matrix for seed {PAPER_CODE_SEED}",
    ),
    "binary_normmatch": (
        ["--input-embedding", "binary", "--code-norm-match"],
        "scale: the binary code scaled to the learned table's input RMS (init std)",
    ),
    "binary_centred": (
        ["--input-embedding", "binary", "--code-centered", "--code-scale", "0.5"],
        "offset: c − ½ (±½), binary's spread with mean zero",
    ),
    "random": (["--input-embedding", "random"], "assignment: fixed Gaussian coordinates of width K"),
    "sinusoidal": (["--input-embedding", "sinusoidal"], "assignment: fixed sinusoidal coordinates of width K"),
    "lowdim": (
        ["--input-embedding", "lowdim"],
        "fixedness at the same dimension: V×K trainable coordinates, the same tiled lift",
    ),
    "gf2_r2": (["--input-embedding", "gf2", "--code-seed", "23456"], "a second recoding (matrix seed 23456)"),
    "gf2_r3": (["--input-embedding", "gf2", "--code-seed", "34567"], "a third recoding (matrix seed 34567)"),
}
MAIN_VARIANTS = ("learned", "binary", "gf2")  # three seeds each
CONTROLS = ("binary_normmatch", "binary_centred", "random", "sinusoidal", "lowdim", "gf2_r2", "gf2_r3")
ANALYSED = ("learned", "binary", "binary_normmatch")  # tools/analyze_model.py readings at the first seed


@dataclasses.dataclass(frozen=True)
class Run:
    variant: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.variant}_s{self.seed}"

    @classmethod
    def parse(cls, text: str) -> "Run":
        """``binary:1`` or ``binary_s1``."""
        m = re.fullmatch(r"(\w+?)(?::|_s)(\d+)", text)
        if not m or m.group(1) not in VARIANTS:
            raise ValueError(f"run {text!r}: expected VARIANT:SEED with VARIANT one of {sorted(VARIANTS)}")
        return cls(m.group(1), int(m.group(2)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyPlan:
    """One regime: data, model recipe, budget, and the ordered list of runs."""

    name: str
    recipe: Path  # trainer YAML (model, optimizer, batch); the variant's flags and --seed go on top
    vocab_size: int  # byte-level BPE trained on the train split of the corpus
    corpus_mb: float
    train_iters: int
    eval_tokens: int  # held-out tokens scored per run (the same windows for every run)
    runs: tuple[Run, ...]
    analysed: tuple[Run, ...] = ()
    analysis_windows: int = 32

    def trainer_flags(self, run: Run, recipe: str | None = None) -> list[str]:
        return [
            "--config",
            recipe or str(self.recipe),
            *VARIANTS[run.variant][0],
            "--seed",
            str(run.seed),
            "--train-iters",
            str(self.train_iters),
        ]

    def config_hash(self, run: Run, data_fingerprint: str) -> str:
        # The recipe's values, not its text: a comment or layout edit does not decide a number.
        identity = {
            "recipe": yaml.safe_load(self.recipe.read_text()),
            "flags": self.trainer_flags(run)[2:],
            "data": data_fingerprint,
            "eval_tokens": self.eval_tokens,
            "analysis_windows": self.analysis_windows if run in self.analysed else None,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def ordered_runs(main: tuple[str, ...], controls: tuple[str, ...], seeds: tuple[int, ...]) -> tuple[Run, ...]:
    """Seed 1 of every main variant and the norm-matched control first (a partial study is already a
    comparison), then the other seeds, then the remaining controls at the first seed."""
    first = [Run(v, seeds[0]) for v in (*main, *controls[:1])]
    rest = [Run(v, s) for s in seeds[1:] for v in main]
    return tuple(first + rest + [Run(v, seeds[0]) for v in controls[1:]])


PLANS = {
    "full": StudyPlan(
        name="full",
        recipe=RECIPES / "study_cpu_v4096.yaml",
        vocab_size=4096,
        corpus_mb=10.0,
        train_iters=750,
        eval_tokens=65_536,
        runs=ordered_runs(MAIN_VARIANTS, CONTROLS, (1, 2, 3)),
        analysed=tuple(Run(v, 1) for v in ANALYSED),
    ),
    "quick": StudyPlan(  # CI: the same code path in about a minute
        name="quick",
        recipe=RECIPES / "study_cpu_quick.yaml",
        vocab_size=512,
        corpus_mb=0.25,
        train_iters=4,
        eval_tokens=2048,
        runs=ordered_runs(("learned", "binary"), (), (1, 2)),
        analysed=(Run("binary", 1),),
        analysis_windows=4,
    ),
}
