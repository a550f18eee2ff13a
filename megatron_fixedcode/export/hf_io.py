"""Hugging Face directory I/O: sharded safetensors + index, JSON files, tokenizer files, and the
completeness of a directory (an export is written to a sibling ``NAME.partial`` that holds
``INCOMPLETE_MARKER`` and is renamed to ``NAME`` when complete, so a killed export leaves nothing
under the final name; readers refuse what is incomplete in one line)."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PARTIAL_SUFFIX = ".partial"
INCOMPLETE_MARKER = "EXPORT_INCOMPLETE"


def parse_size(size: str | int) -> int:
    """``"5GB"``, ``"200MB"``, ``"10KB"`` or a byte count."""
    if isinstance(size, int):
        return size
    text = size.strip().upper()
    for suffix, factor in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if text.endswith(suffix) and text[: -len(suffix)].strip().replace(".", "", 1).isdigit():
            return int(float(text[: -len(suffix)]) * factor)
    if text.isdigit():
        return int(text)
    raise ValueError(f"--max-shard-size {size!r}: expected e.g. 5GB, 500MB or a byte count")


def write_safetensors(
    out_dir: Path,
    tensors: dict[str, torch.Tensor],
    max_shard_size: str | int = "5GB",
    metadata: dict[str, str] | None = None,
) -> list[str]:
    """Shards of at most ``max_shard_size`` bytes (a bigger tensor gets its own shard) with a
    ``model.safetensors.index.json``; one ``model.safetensors`` when everything fits."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    meta = {"format": "pt", **(metadata or {})}
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / SINGLE_FILE), metadata=meta)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for shard_name, shard in zip(names, shards):
        save_file(shard, str(out_dir / shard_name), metadata=meta)
        weight_map.update({k: shard_name for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return names


def weight_files(model_dir: Path) -> list[str]:
    """The safetensors files of a HF directory (single file, or the shards its index names)."""
    model_dir = Path(model_dir)
    if (model_dir / INDEX_FILE).exists():
        index = _read_json(model_dir / INDEX_FILE)
        if not isinstance(index.get("weight_map"), dict):
            raise ValueError(f"{model_dir / INDEX_FILE}: no weight_map")
        return sorted(set(index["weight_map"].values()))
    if (model_dir / SINGLE_FILE).exists():
        return [SINGLE_FILE]
    raise ValueError(f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints are read)")


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name → shape from a safetensors header, refusing a file shorter or longer than its
    header says (a truncated write): the 8-byte header length, the JSON header, then the data."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length)) if length <= os.path.getsize(path) else None
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (the index names it; an incomplete export?)") from None
    except (struct.error, ValueError, UnicodeDecodeError):
        header = None
    try:
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        end = max((int(v["data_offsets"][1]) for v in entries.values()), default=0)
    except (AttributeError, KeyError, TypeError, IndexError, ValueError):
        raise ValueError(f"{path}: not a safetensors file (an empty or truncated write?)") from None
    if os.path.getsize(path) != 8 + length + end:
        raise ValueError(
            f"{path}: {os.path.getsize(path)} bytes, its header describes {8 + length + end} (a truncated write?)"
        )
    return {k: list(v["shape"]) for k, v in entries.items()}


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF directory (single file or index + shards)."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    for name in weight_files(model_dir):
        safetensors_shapes(model_dir / name)  # a truncated file: one line, not the reader's traceback
        tensors.update(load_file(str(model_dir / name)))
    return tensors


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    text = path.read_text(errors="replace")
    if not text.strip():
        raise ValueError(f"{path}: empty (an export killed while writing it?)")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_config(model_dir: Path) -> dict[str, Any]:
    """``config.json`` of a complete HF directory: a killed export's ``NAME.partial`` (it holds
    ``INCOMPLETE_MARKER``), a missing or unparsable config, or missing or truncated weight files
    are refused in one line naming the file, before anything is loaded."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        partial = partial_dir(model_dir)
        hint = f"; {partial} is an export that did not finish" if partial.is_dir() else ""
        raise ValueError(f"{model_dir}: no such directory{hint}")
    if (model_dir / INCOMPLETE_MARKER).exists():
        raise ValueError(
            f"{model_dir}: an incomplete export (its writer stopped before finishing; "
            f"{INCOMPLETE_MARKER} is there): export the checkpoint again"
        )
    path = model_dir / "config.json"
    if not path.is_file():
        raise ValueError(f"{model_dir}: no config.json (an incomplete export?)")
    config = _read_json(path)
    for name in weight_files(model_dir):
        safetensors_shapes(model_dir / name)
    return config


def partial_dir(out_dir: Path) -> Path:
    """Where an export to ``out_dir`` is written before it is renamed to ``out_dir``."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + PARTIAL_SUFFIX)


def lock_file(out_dir: Path) -> Path:
    """The lock an export to ``out_dir`` holds while it writes ``out_dir.partial``."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".lock")


def begin_export(out_dir: Path) -> Path:
    """A fresh ``out_dir.partial`` (a killed export's leftover is removed) marked incomplete."""
    tmp = partial_dir(out_dir)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / INCOMPLETE_MARKER).write_text(f"an unfinished export to {out_dir}; it is renamed there when complete\n")
    return tmp


def finish_export(tmp: Path, out_dir: Path) -> Path:
    """Sync every file of ``tmp``, drop the marker and rename it to ``out_dir`` (replacing an old
    export only now, so a failed export never destroys the previous one)."""
    for path in tmp.iterdir():
        if path.is_file() and path.name != INCOMPLETE_MARKER:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    (tmp / INCOMPLETE_MARKER).unlink()
    old = out_dir.with_name(out_dir.name + ".replaced")
    if out_dir.exists():
        if old.exists():
            shutil.rmtree(old)
        out_dir.rename(old)
    tmp.rename(out_dir)
    fd = os.open(out_dir.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def write_tokenizer(
    out_dir: Path, tokenizer_type: str | None, tokenizer_model: str | None, tokenizer: Any, model_max_length: int
) -> list[str]:
    """Copy the training tokenizer and describe it for ``AutoTokenizer`` (no BOS/EOS is added
    on encode: the training data had none but the EOD separator)."""
    if not tokenizer_model:
        return []
    src = Path(tokenizer_model)
    special = {"eos_token": tokenizer.detokenize([tokenizer.eod])}
    if tokenizer.bos is not None:
        special["bos_token"] = tokenizer.detokenize([tokenizer.bos])
    if tokenizer.pad is not None:
        special["pad_token"] = tokenizer.detokenize([tokenizer.pad])
    written = []
    if tokenizer_type == "GPT2BPETokenizer":  # vocab.json + merges.txt as one tokenizers object
        (out_dir / "tokenizer.json").write_text(tokenizer.hf_tokenizer.to_str(), encoding="utf-8")
        written.append("tokenizer.json")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    elif tokenizer_type == "HuggingFaceTokenizer":
        json_path = src / "tokenizer.json" if src.is_dir() else src
        shutil.copyfile(json_path, out_dir / "tokenizer.json")
        written.append("tokenizer.json")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    else:
        shutil.copyfile(src, out_dir / "tokenizer.model")
        written.append("tokenizer.model")
        config = {
            "tokenizer_class": "LlamaTokenizer",
            "legacy": True,
            "add_bos_token": False,
            "add_eos_token": False,
            "sp_model_kwargs": {},
        }
    config.update(special, model_max_length=model_max_length)
    write_json(out_dir / "tokenizer_config.json", config)
    write_json(out_dir / "special_tokens_map.json", special)
    return [*written, "tokenizer_config.json", "special_tokens_map.json"]
