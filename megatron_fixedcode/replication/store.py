"""Finished runs on disk: one JSON per run (``<variant>_s<seed>.json``), written atomically when the
run's evaluation is complete, so a killed sitting never leaves a record that looks finished. A
record counts as done only for the config hash it was made with."""

from __future__ import annotations

import json
import os
from pathlib import Path

from megatron_fixedcode.replication.study import Run


class ResultStore:
    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path(self, run: Run) -> Path:
        return self.directory / f"{run.name}.json"

    def load(self, run: Run) -> dict | None:
        path = self.path(run)
        return json.loads(path.read_text()) if path.is_file() else None

    def is_done(self, run: Run, config_hash: str) -> bool:
        record = self.load(run)
        return record is not None and record.get("config_hash") == config_hash

    def write(self, run: Run, record: dict) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(run)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
        return path

    def current(self, runs: tuple[Run, ...], hashes: dict[Run, str]) -> dict[Run, dict]:
        """The records of ``runs`` made with today's config hashes (stale ones left out)."""
        return {r: rec for r in runs if (rec := self.load(r)) is not None and rec.get("config_hash") == hashes[r]}
