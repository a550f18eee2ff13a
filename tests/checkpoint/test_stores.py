"""The directory stores' side of the one store interface (checkpoint/stores.py), on directories laid out as a
save leaves them: which step is the newest valid one, what forget removes and what it refuses."""

from __future__ import annotations

import types

import pytest

from megatron_fixedcode.checkpoint.paths import LATEST_MARKER, checkpoint_dir
from megatron_fixedcode.checkpoint.stores import NON_PERSISTENT, PERSISTENT, DirectoryStore, directory_stores
from megatron_fixedcode.checkpoint.verify import write_checksums


def _saved(root, step: int, marker: bool = True):
    target = checkpoint_dir(root, step)
    target.mkdir(parents=True)
    (target / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (target / "__0_0.distcp").write_bytes(bytes(range(64)) * step)
    write_checksums(target)
    if marker:
        (root / LATEST_MARKER).write_text(str(step))
    return target


def test_the_newest_valid_step_skips_an_unfinished_save_and_a_damaged_one(tmp_path):
    store = DirectoryStore(PERSISTENT, str(tmp_path))
    assert store.steps() == [] and store.newest_step() is None
    _saved(tmp_path, 2)
    _saved(tmp_path, 4)
    _saved(tmp_path, 6, marker=False)  # written, marker not moved: a save that did not finish
    assert store.steps() == [4, 2] and store.newest_step() == 4
    (checkpoint_dir(tmp_path, 4) / "__0_0.distcp").write_bytes(b"short")  # another size than recorded
    assert "__0_0.distcp" in store.check(4) and store.newest_step() == 2
    (tmp_path / LATEST_MARKER).write_text("8")  # the marker names a step whose directory is gone
    assert store.steps() == [8, 6, 4, 2] and "metadata.json missing" in store.check(8)
    assert store.newest_step() == 6


def test_forget_empties_a_non_persistent_store_and_refuses_a_persistent_one(tmp_path):
    ck = types.SimpleNamespace(
        load=str(tmp_path), non_persistent_ckpt_type="global", non_persistent_dir=lambda root: f"{root}/np"
    )
    persistent, non_persistent = directory_stores(ck)
    assert (persistent.kind, non_persistent.kind) == (PERSISTENT, NON_PERSISTENT)
    assert non_persistent.root == f"{tmp_path}/np" and non_persistent.keep_last == 1
    _saved(tmp_path, 3)
    _saved(tmp_path / "np", 5)
    non_persistent.forget()
    assert non_persistent.newest_step() is None and not (tmp_path / "np" / LATEST_MARKER).exists()
    with pytest.raises(ValueError, match="persistent checkpoints are not forgotten"):
        persistent.forget()
    assert persistent.newest_step() == 3
    ck.non_persistent_ckpt_type = "local"
    assert [s.kind for s in directory_stores(ck)] == [PERSISTENT]
