"""A run's tokenizer carried in its checkpoint root, so a checkpoint needs nothing outside it.

The trainer copies the files its tokenizer type reads (``tokenizer.json`` with ``tokenizer_config.json``
and ``special_tokens_map.json`` when beside it; ``vocab.json`` + ``merges.txt``; a SentencePiece
``tokenizer.model``) once into ``SAVE/tokenizer/<sha256 prefix of the files>/`` (a temporary folder,
renamed when complete): every checkpoint of the run shares it, another tokenizer gets its own folder.
The checkpoint's tokenizer record names the copy relative to ``SAVE`` (``copy``) beside the path it
was trained from (``model``, ``merge_file``: for information); readers find the copy relative to
where the checkpoint lies now. Checkpoints saved before (no ``copy``) are read from the recorded path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Optional

from megatron_fixedcode.tokenizers.base import Tokenizer
from megatron_fixedcode.tokenizers.huggingface_tokenizer import resolve_tokenizer_json
from megatron_fixedcode.tokenizers.registry import build_tokenizer

CARRIED_DIR = "tokenizer"
_HF_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")


def _main_file(tokenizer_type: str) -> str:
    return {"GPT2BPETokenizer": "vocab.json", "HuggingFaceTokenizer": "tokenizer.json"}.get(
        tokenizer_type, "tokenizer.model"
    )


def _sources(record: dict) -> dict[str, Path]:
    """File name in the copy -> the file the record names."""
    kind, model = record.get("type") or "HuggingFaceTokenizer", Path(record["model"])
    if kind == "GPT2BPETokenizer":
        return {"vocab.json": model, "merges.txt": Path(record["merge_file"])}
    if kind == "HuggingFaceTokenizer":
        json_path = resolve_tokenizer_json(model)
        return {
            "tokenizer.json": json_path,
            **{name: json_path.parent / name for name in _HF_EXTRAS if (json_path.parent / name).is_file()},
        }
    return {_main_file(kind): model}


def _digest(files: dict[str, Path]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()[:16]


def carried_record(record: dict, fingerprint: Optional[str] = None) -> dict:
    """``record`` (:func:`~megatron_fixedcode.tokenizers.registry.tokenizer_record`) with where its copy
    goes under the checkpoint root (``copy``) and the tokenizer's fingerprint; unchanged when it names
    no file."""
    if not record.get("model"):
        return record
    sources = _sources(record)
    folder = f"{CARRIED_DIR}/{_digest(sources)}"
    copy = {
        "dir": folder,
        "model": f"{folder}/{_main_file(record.get('type') or '')}",
        "files": sorted(f"{folder}/{name}" for name in sources),
    }
    if "merges.txt" in sources:
        copy["merge_file"] = f"{folder}/merges.txt"
    return {**record, **({"fingerprint": fingerprint} if fingerprint else {}), "copy": copy}


def write_carried_copy(root: str | Path, record: dict) -> Optional[Path]:
    """Write ``root/<copy dir>`` once (rank 0, before the first save): files copied into a temporary
    folder, checked against the folder's hash, renamed. An existing folder of that name holds the same
    bytes (its name is their hash); a checkpoint's checksums cover its files."""
    copy = record.get("copy")
    if not copy:
        return None
    final = Path(root) / copy["dir"]
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name, src in _sources(record).items():
            shutil.copyfile(src, tmp / name)
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        if _digest({p.name: p for p in tmp.iterdir()}) != final.name:
            raise ValueError(
                f"tokenizer {record['model']}: its files changed since the run started "
                f"(they no longer hash to {final.name}); restore them or restart the run"
            )
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # not another writer of the same bytes first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def carried_files(record: dict, root: str | Path) -> tuple[Optional[str], Optional[str]]:
    """(model, merge_file) of the copy under ``root`` (the directory holding ``iter_*``), or
    (None, None) when the checkpoint carries none (saved before, or the copy is gone)."""
    copy = record.get("copy") or {}
    if not copy or not (Path(root) / copy["model"]).exists():
        return None, None
    merges = copy.get("merge_file")
    return str(Path(root) / copy["model"]), str(Path(root) / merges) if merges else None


def checkpoint_tokenizer_files(
    record: dict, root: str | Path, where: str, explicit: Optional[str] = None, saved_fingerprint: Optional[str] = None
) -> tuple[Optional[str], Optional[str]]:
    """(model, merge_file) of the tokenizer of the checkpoint under ``root``: ``explicit``
    (``--tokenizer-model``) if given and the same tokenizer (fingerprint) as the one the checkpoint
    carries or was trained with, else the carried copy, else the recorded path. (None, None) when it
    names none (pre-tokenized data, --vocab-size). A ValueError, one line, otherwise."""
    model, merges = carried_files(record, root)
    kind = record.get("type") or "HuggingFaceTokenizer"
    if explicit:
        ours = build_tokenizer(kind, explicit, merge_file=merges or record.get("merge_file"))
        theirs = build_tokenizer(kind, model, merge_file=merges).fingerprint if model else saved_fingerprint
        if record.get("model") and theirs and ours.fingerprint != theirs:
            carried = f"carried as {model}, " if model else ""
            raise ValueError(
                f"--tokenizer-model {explicit} (fingerprint {ours.fingerprint}) is not the tokenizer "
                f"{where} was trained with ({carried}trained from {record['model']}, fingerprint "
                f"{theirs}); drop --tokenizer-model to use the checkpoint's own"
            )
        return explicit, merges or record.get("merge_file")
    if model:
        return model, merges
    if not record.get("model"):
        return None, None
    missing = [p for p in (record["model"], record.get("merge_file")) if p and not Path(p).exists()]
    if missing:
        gone = " (its carried copy is missing too)" if record.get("copy") else ""
        raise ValueError(
            f"{where}: tokenizer {missing[0]} recorded in the checkpoint is missing{gone}; pass --tokenizer-model"
        )
    return record["model"], record.get("merge_file")


def checkpoint_tokenizer(
    record: dict, root: str | Path, where: str, explicit: Optional[str] = None, saved_fingerprint: Optional[str] = None
) -> Optional[Tokenizer]:
    """The tokenizer :func:`checkpoint_tokenizer_files` finds, built; None when the checkpoint names none."""
    model, merges = checkpoint_tokenizer_files(record, root, where, explicit, saved_fingerprint)
    if model is None:
        return None
    return build_tokenizer(record.get("type") or "HuggingFaceTokenizer", model, merge_file=merges)
