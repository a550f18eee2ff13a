"""Worker side: parse, split and batch-encode one chunk of records.

The same function runs in-process (``workers=1``) and in pool processes, so outputs do not
depend on the worker count.
"""

import collections
import hashlib
import itertools
import json
import os
from typing import Optional

import numpy as np

from megatron_fixedcode.compat.process import die_with_parent
from megatron_fixedcode.data.indexed_format import optimal_dtype
from megatron_fixedcode.data.preprocess.config import PreprocessConfig
from megatron_fixedcode.data.preprocess.inputs import Chunk
from megatron_fixedcode.tokenizers import Tokenizer, build_tokenizer


def is_validation_document(doc_key: bytes, seed: int, valid_fraction: float) -> bool:
    """Document-level split: a seeded 64-bit hash of the id (or text) below the fraction."""
    digest = hashlib.blake2b(doc_key, digest_size=8, key=seed.to_bytes(8, "little", signed=True))
    return int.from_bytes(digest.digest(), "little") < valid_fraction * 2.0**64


_WORKER: dict = {}


def sentence_splitter():
    """nltk punkt if its data is installed; never downloads (falls back to untrained punkt)."""
    from megatron_fixedcode.utils.lazy import require

    require("nltk", "data", "--split-sentences")
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    try:
        from nltk.tokenize.punkt import PunktTokenizer

        return PunktTokenizer("english"), True
    except (LookupError, ImportError, OSError):
        return PunktSentenceTokenizer(), False


def init_worker(
    cfg: PreprocessConfig,
    threads: Optional[int],
    tokenizer: Optional[Tokenizer] = None,
    parent_pid: Optional[int] = None,
) -> None:
    """Per-process state; ``threads`` is set in pool processes, ``tokenizer`` when in-process.

    A pool process dies with the run (``parent_pid``): a SIGKILLed run leaves no workers
    behind, and none of them keeps the output lock held.
    """
    if parent_pid is not None:
        die_with_parent(expected_parent=parent_pid)
    if threads is not None:  # pool process: share the cores between workers
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        if threads == 1:  # never switch it on: after a fork the tokenizers library may have turned it off
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["cfg"] = cfg
    _WORKER["tok"] = tokenizer or build_tokenizer(
        cfg.tokenizer_type, cfg.tokenizer_model, cfg.eod_token, cfg.merge_file
    )
    _WORKER["dtype"] = optimal_dtype(_WORKER["tok"].vocab_size)
    _WORKER["splitter"] = sentence_splitter()[0] if cfg.split_sentences else None


def _parse(chunk: Chunk, index: int, cfg: PreprocessConfig):
    """One record -> (doc key for the split hash, {json key: [texts]}) or raises ValueError."""
    item = chunk.items[index]
    if chunk.is_parquet:
        record = item
    else:
        if not item.strip():
            return None
        try:
            record = json.loads(item)
        except UnicodeDecodeError as e:
            raise ValueError(f"not valid UTF-8 ({e.reason})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"malformed JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(record, dict):
            raise ValueError("a JSON line must be an object")
    texts = {}
    for key in cfg.json_keys:
        value = record.get(key)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"missing or non-text key {key!r}" if value is None else f"key {key!r} is not text")
        try:
            size = sum(len(text.encode("utf-8")) for text in value)
        except UnicodeEncodeError:
            raise ValueError(f"key {key!r} holds a lone surrogate (\\ud800-\\udfff), not valid Unicode") from None
        if size > cfg.max_document_bytes:
            raise ValueError(
                f"key {key!r} holds {size} bytes of text, more than --max-document-bytes "
                f"{cfg.max_document_bytes} (tokenizing needs ~140 bytes of memory per text byte); "
                "split the document into several records or raise the limit"
            )
        texts[key] = value
    return split_key(record, texts, cfg), texts


def split_key(record: dict, texts: dict, cfg: PreprocessConfig) -> tuple[str, bytes]:
    """The paper's split key, decided per document: ``("id", id)`` when the record holds a
    non-empty ``--id-key`` value, else ``("text", text of the first json key)`` (hashed by
    :func:`is_validation_document`), so a corpus where only some records carry ids still
    splits every document deterministically."""
    if cfg.id_key is not None:
        value = record.get(cfg.id_key)
        if value is not None and str(value) != "":
            return "id", str(value).encode("utf-8")
    return "text", "".join(texts[cfg.json_keys[0]]).encode("utf-8")


def encode_chunk(chunk: Chunk) -> dict:
    """Parse and encode a chunk; bad records are reported, not raised, so order decides."""
    cfg, tok, dtype = _WORKER["cfg"], _WORKER["tok"], _WORKER["dtype"]
    where = lambda i: f"{chunk.path}:{'row ' if chunk.is_parquet else ''}{chunk.first_line + i}"  # noqa: E731 (a one-line closure)
    result = {
        "errors": [],
        "empty": 0,
        "records": 0,
        "parts": {},
        "bytes_done": chunk.bytes_done,
        "split_keys": {"id": 0, "text": 0},
    }
    if chunk.error:
        result["errors"].append((where(0) if chunk.first_line else chunk.path, chunk.error))
        return result
    docs = []  # (split, key, sentence list)
    for i in range(len(chunk.items)):
        try:
            parsed = _parse(chunk, i, cfg)
        except ValueError as e:
            result["errors"].append((where(i), str(e)))
            continue
        if parsed is None:
            continue
        result["records"] += 1
        (key_kind, doc_key), texts = parsed
        result["split_keys"][key_kind] += 1
        valid = cfg.valid_fraction > 0 and is_validation_document(doc_key, cfg.split_seed, cfg.valid_fraction)
        for key, sentences in texts.items():
            if _WORKER["splitter"] is not None:
                sentences = [s for text in sentences for s in _WORKER["splitter"].tokenize(text)]
            docs.append(("valid" if valid else "train", key, sentences))
    flat = [s for _, _, sentences in docs for s in sentences]
    encoded = iter(tok.encode_batch(flat) if flat else [])
    collected = collections.defaultdict(lambda: ([], [], []))  # ids, sequence lengths, seqs per doc
    for split, key, sentences in docs:
        seqs = [ids for ids in (next(encoded) for _ in sentences) if ids]
        if not seqs:
            result["empty"] += 1
            continue
        if cfg.append_eod:
            seqs[-1] = seqs[-1] + [tok.eod]
        ids, lengths, counts = collected[(split, key)]
        ids.extend(seqs)
        lengths.extend(len(s) for s in seqs)
        counts.append(len(seqs))
    for part, (ids, lengths, counts) in collected.items():
        flat_ids = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=sum(lengths))
        result["parts"][part] = (flat_ids, np.asarray(lengths, np.int64), np.asarray(counts, np.int64))
    return result
