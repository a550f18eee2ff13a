"""An export that runs out of disk: one line naming it and the free space, exit code 2, no traceback;
the partial export is removed and an earlier export at the same path (``--overwrite``) is kept whole."""

from __future__ import annotations

import hashlib

import pytest

from megatron_fixedcode.cli.convert_checkpoint_to_hf import main as convert_main
from tests.helpers.disk import small_tmpfs
from tests.helpers.export import random_checkpoint

pytest.importorskip("safetensors")


def _digest(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_an_export_on_a_full_disk_keeps_the_earlier_one(tmp_path, capsys):
    src = random_checkpoint(tmp_path / "src")
    assert convert_main(["--load", str(src), "--output", str(tmp_path / "sized"), "--no-parity-check"]) == 0
    size = sum(p.stat().st_size for p in (tmp_path / "sized").iterdir())
    with small_tmpfs(tmp_path / "disk", str(int(size * 1.5) // 1024 + 8) + "k") as disk:  # one export, not two
        out = disk / "hf"
        assert convert_main(["--load", str(src), "--output", str(out), "--no-parity-check"]) == 0
        before = _digest(out)
        capsys.readouterr()
        assert convert_main(["--load", str(src), "--output", str(out), "--no-parity-check", "--overwrite"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: no space left on device writing {out}.partial ("), err
        assert err[0].endswith(
            f"MiB free there; No space left on device): the partial export was removed and {out} "
            "is as it was; free space, then run the same command again"
        )
        assert _digest(out) == before and sorted(p.name for p in disk.iterdir()) == ["hf"]
