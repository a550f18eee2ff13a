"""Streaming readers: JSONL, JSONL.gz and Parquet inputs as bounded, ordered chunks.

Read errors become chunks carrying the error, so they are reported in input order together
with the per-record errors that workers find.
"""

import dataclasses
import glob
import gzip
import zlib
from pathlib import Path
from typing import Iterator, Optional, Sequence

from megatron_fixedcode.data.preprocess.config import PreprocessConfig

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


def expand_inputs(inputs: Sequence[str]) -> list[Path]:
    """Files, globs or directories (recursive) -> files in a fixed order."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
        elif path.is_file():
            found = [path]
        else:
            found = sorted(Path(p) for p in glob.glob(item, recursive=True) if Path(p).is_file())
        if not found:
            raise ValueError(f"--input {item!r}: no {'/'.join(SUFFIXES)} files found")
        for f in found:
            if not f.name.endswith(SUFFIXES):
                raise ValueError(f"--input {f}: unsupported file type (expected {', '.join(SUFFIXES)})")
        files += found
    return files


@dataclasses.dataclass
class Chunk:
    """A slice of one input file: raw JSON lines or Parquet rows, or a read error."""

    path: str
    first_line: int
    items: list
    is_parquet: bool = False
    bytes_done: int = 0
    error: Optional[str] = None


def _jsonl_chunks(path: Path, cfg: PreprocessConfig, bytes_before: int) -> Iterator[Chunk]:
    raw = open(path, "rb")
    stream = gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw
    lines, num_bytes, first, line_no = [], 0, 1, 0
    with raw, stream:
        try:
            for line_no, line in enumerate(stream, 1):
                if not lines:
                    first = line_no
                lines.append(line)
                num_bytes += len(line)
                if len(lines) >= cfg.chunk_docs or num_bytes >= cfg.chunk_bytes:
                    yield Chunk(str(path), first, lines, bytes_done=bytes_before + raw.tell())
                    lines, num_bytes = [], 0
        except (EOFError, OSError, zlib.error) as e:
            if lines:
                yield Chunk(str(path), first, lines)
            yield Chunk(str(path), line_no + 1, [], error=f"truncated or corrupt gzip ({e})")
            return
    if lines:
        yield Chunk(str(path), first, lines, bytes_done=bytes_before + path.stat().st_size)
    if line_no == 0:
        yield Chunk(str(path), 0, [], error="empty file")


def _parquet_chunks(path: Path, cfg: PreprocessConfig, bytes_before: int) -> Iterator[Chunk]:
    from megatron_fixedcode.utils.lazy import require

    pyarrow = require("pyarrow", "data", f"reading parquet ({path})")
    import pyarrow.parquet as pq

    columns = list(dict.fromkeys([*cfg.json_keys, *([cfg.id_key] if cfg.id_key else [])]))
    row = 0
    try:
        parquet = pq.ParquetFile(path)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise ValueError(f"{path}: column(s) {missing} not found; columns are {parquet.schema_arrow.names}")
        num_rows = max(parquet.metadata.num_rows, 1)
        for batch in parquet.iter_batches(batch_size=cfg.chunk_docs, columns=columns):
            records = batch.to_pylist()
            done = bytes_before + int(path.stat().st_size * min(1.0, (row + len(records)) / num_rows))
            yield Chunk(str(path), row + 1, records, is_parquet=True, bytes_done=done)
            row += len(records)
    except (pyarrow.ArrowException, OSError) as e:
        yield Chunk(str(path), row + 1 if row else 0, [], is_parquet=True, error=f"unreadable parquet ({e})")
        return
    if row == 0:
        yield Chunk(str(path), 0, [], is_parquet=True, error="empty file")


def iter_chunks(files: Sequence[Path], cfg: PreprocessConfig) -> Iterator[Chunk]:
    """All inputs in order, as bounded chunks."""
    bytes_before = 0
    for path in files:
        if path.stat().st_size == 0:
            yield Chunk(str(path), 0, [], error="empty file")
            continue
        reader = _parquet_chunks if path.name.endswith(".parquet") else _jsonl_chunks
        yield from reader(path, cfg, bytes_before)
        bytes_before += path.stat().st_size
