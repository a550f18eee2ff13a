"""Where everything of one study lives: a single directory, so that the study is one unit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

VARIANTS = ("learned", "binary", "gf2")  # paper 2's three input interfaces, in its order


@dataclasses.dataclass(frozen=True)
class StudyLayout:
    root: Path

    @property
    def options(self) -> Path:  # the options the study was planned with (study.json)
        return self.root / "study.json"

    @property
    def data(self) -> Path:  # plan.json, the shards' .bin/.idx, manifest.json
        return self.root / "data"

    @property
    def manifest(self) -> Path:
        return self.data / "manifest.json"

    def checkpoints(self, variant: str) -> Path:
        return self.root / "runs" / variant / "checkpoints"

    def train_logs(self, variant: str) -> Path:  # metrics.jsonl, config-<job>.json, node<N>.log
        return self.root / "runs" / variant / "logs"

    def export(self, variant: str) -> Path:
        return self.root / "exports" / variant

    def eval_result(self, variant: str) -> Path:
        return self.root / "eval" / f"{variant}.json"

    def record(self, variant: str) -> Path:
        return self.root / "records" / f"{variant}.json"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def jobs(self) -> Path:  # job scripts and the ids of submitted jobs
        return self.root / "jobs"

    @property
    def logs(self) -> Path:  # Slurm output of every job
        return self.root / "logs"
