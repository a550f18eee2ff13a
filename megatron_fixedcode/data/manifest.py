"""``manifest.json``: the list of a shard-parallel indexing's outputs that the trainer reads.

Written only when every shard of the plan is complete and consistent (a failed shard only with
``skip_failed``, then listed under ``excluded``), so 234 prefixes never go on a command line by
hand. Prefixes are stored relative to the manifest's directory (the directory can move).
The trainer resolves ``--data-manifest`` into ``--data-path`` / ``--valid-data-path`` here and
checks the manifest's tokenizer fingerprint against ``--tokenizer-model``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy

from megatron_fixedcode.data.config import check_blend_weights

MANIFEST_FORMAT = "megatron-fixedcode-shard-manifest"
SPLIT_RULE = (
    "valid when blake2b(key, key=split_seed) as a 64-bit integer < valid_fraction * 2^64; "
    "key = the record's id_key value where present, else the text of the first json key"
)


def _tokens(prefix: str) -> tuple[int, int]:
    """(tokens, documents) of one shard, after the start-up consistency check."""
    from megatron_fixedcode.data.indexed_format import IndexFile
    from megatron_fixedcode.data.validate import check_shard

    shape = check_shard(prefix, field="shard")
    sizes = IndexFile(prefix + ".idx").sequence_lengths
    return int(sizes.sum(dtype=numpy.int64)), shape["documents"]


def build_manifest(output_dir: str, skip_failed: bool = False) -> dict:
    """The manifest of a plan's outputs; ``ValueError`` naming shards that are not ready."""
    # at use: the shard plan imports the preprocessing pipeline and its tokenizer libraries, which parsing
    # the trainer's --data-manifest (resolve_data_sources) does not need
    from megatron_fixedcode.data import shards as shard_plan

    plan = shard_plan.read_plan(output_dir)
    st = plan["settings"]
    tokenizer = shard_plan.plan_tokenizer(plan)
    status = shard_plan.plan_status(plan, tokenizer.fingerprint)
    pending = [
        f"{n} ({s}{': ' + d if s == 'stale' else ''})" for n, (s, d) in status.items() if s in ("missing", "stale")
    ]
    failed = {n: d for n, (s, d) in status.items() if s == "failed"}
    if pending:
        raise ValueError(
            f"{output_dir}: {len(pending)} of {len(status)} shards are not complete: "
            f"{', '.join(pending[:5])}{' ...' if len(pending) > 5 else ''}; re-submit the array job"
        )
    if failed and not skip_failed:
        first = next(iter(failed))
        raise ValueError(
            f"{output_dir}: {len(failed)} shards failed ({', '.join(failed)}); first: {first}: "
            f"{failed[first]}; fix or remove them, or write the manifest without them (--skip-failed)"
        )
    out = Path(plan["output_dir"])
    entries, excluded = [], []
    for path in plan["inputs"]:
        name = shard_plan.shard_name(path)
        if name in failed:
            excluded.append({"name": name, "input": path, "error": failed[name]})
            continue
        summary = json.loads((out / f"{name}_summary.json").read_text())
        entry = {"name": name, "input": path}
        for split, prefix in shard_plan.shard_prefixes(plan, path).items():
            try:
                tokens, documents = _tokens(prefix)
            except ValueError as e:
                raise ValueError(f"{output_dir}: shard {name} is inconsistent: {e}") from None
            if documents != summary["documents"][split]:
                raise ValueError(
                    f"{output_dir}: shard {name}: {prefix} holds {documents} documents, its summary "
                    f"says {summary['documents'][split]}; re-index it"
                )
            # the content record (.bin size and sha256, .idx sha256) for tools/verify_dataset.py; a shard
            # indexed before .bin hashes were recorded carries what its summary has
            content = summary.get("outputs_sha256", {}).get(os.path.basename(prefix), {})
            entry[split] = {
                "prefix": os.path.relpath(prefix, out),
                "documents": documents,
                "tokens": tokens,
                "eligible_documents": summary["documents_with_min_doc_tokens"][split],
                **content,
            }
        entries.append(entry)
    splits = ("train", "valid") if st["valid_fraction"] > 0 else ("train",)
    totals = {
        s: {k: sum(e[s][k] for e in entries) for k in ("documents", "tokens", "eligible_documents")} for s in splits
    }
    return {
        "format": MANIFEST_FORMAT,
        "version": 1,
        "tokenizer": tokenizer.describe(),
        "split": {
            "rule": SPLIT_RULE,
            "id_key": st["id_key"],
            "valid_fraction": st["valid_fraction"],
            "split_seed": st["split_seed"],
        },
        "json_key": st["json_keys"][0],
        "append_eod": st["append_eod"],
        "min_doc_tokens": st["min_doc_tokens"],
        "totals": totals,
        "shards": entries,
        "excluded": excluded,
    }


def write_manifest(output_dir: str, skip_failed: bool = False, path: Optional[str] = None) -> tuple[dict, Path]:
    manifest = build_manifest(output_dir, skip_failed)
    target = Path(path) if path else Path(output_dir) / "manifest.json"
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, target)
    return manifest, target


def load_manifest(path: str) -> dict:
    """A manifest with its prefixes made absolute; ``ValueError`` naming the file otherwise."""
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--data-manifest {path}: unreadable ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"--data-manifest {path}: not a shard manifest (write it with tools/write_manifest.py)")
    base = Path(path).resolve().parent
    for entry in manifest["shards"]:
        for split in ("train", "valid"):
            if split in entry:
                entry[split]["prefix"] = str(base / entry[split]["prefix"])
    return manifest


def _fmt(weight: float) -> str:
    return repr(float(weight))


def blend_from_manifests(
    paths: Sequence[str],
    weights: Optional[Sequence[float]] = None,
    tokenizer_fingerprint: Optional[str] = None,
    tokenizer_model: Optional[str] = None,
) -> tuple[list[str], Optional[list[str]]]:
    """``(data_path, valid_data_path)`` in Megatron's list form from one or more manifests.

    One manifest without weights: its prefixes in manifest order (exactly what one would type).
    With weights (one per manifest, e.g. paper 1's 0.8 / 0.2): weight/prefix pairs, a shard's
    weight being its manifest's weight times its share of that manifest's tokens. Shards with no
    documents in a split are left out of that split.
    """
    if weights is not None and len(weights) != len(paths):
        raise ValueError(f"--data-manifest-weights: {len(weights)} weights for {len(paths)} manifests")
    if weights is not None:
        check_blend_weights(weights, paths, "--data-manifest-weights")
    manifests = [load_manifest(p) for p in paths]
    for path, m in zip(paths, manifests):
        fp = m["tokenizer"]["fingerprint"]
        if tokenizer_fingerprint is not None and fp != tokenizer_fingerprint:
            raise ValueError(
                f"--data-manifest {path}: indexed with tokenizer {m['tokenizer']['path']} (fingerprint {fp}), but "
                f"this run's tokenizer {tokenizer_model} has fingerprint {tokenizer_fingerprint}; train with the "
                "tokenizer the data was indexed with, or re-index"
            )
    result = []
    for split in ("train", "valid"):
        items = []
        for i, m in enumerate(manifests):
            used = [e[split] for e in m["shards"] if split in e and e[split]["documents"] > 0]
            if weights is None:
                items += [u["prefix"] for u in used]
            else:
                total = sum(u["tokens"] for u in used)
                items += [x for u in used for x in (_fmt(weights[i] * u["tokens"] / total), u["prefix"])]
        result.append(items or None)
    if result[0] is None:
        raise ValueError(f"--data-manifest {' '.join(paths)}: no train shard holds any document")
    return result[0], result[1]


def read_data_args_file(path: str) -> list[str]:
    """Megatron-LM's ``--data-args-path``: a file holding the ``--data-path`` string."""
    try:
        words = Path(path).read_text().split()
    except OSError as e:
        raise ValueError(f"--data-args-path {path}: {e.strerror}") from None
    if not words:
        raise ValueError(f"--data-args-path {path}: the file is empty")
    return words


def resolve_data_sources(args, recipe: Optional[dict] = None) -> None:
    """Turn ``--data-args-path`` / ``--data-manifest`` into ``data_path`` / ``valid_data_path``
    on the argparse namespace (the trainer's hook; raises ``ValueError`` naming the flag).

    ``recipe`` holds the recipe's ``data_path`` / ``valid_data_path``: a data source given for
    this run replaces them (as any flag overrides the recipe), e.g. paper 1's recipe blend by
    two manifests.
    """
    manifests = getattr(args, "data_manifest", None)
    if isinstance(manifests, str):
        manifests = manifests.split()
    recipe = recipe or {}
    replaced = (
        ("data_path", "train_data_path", "valid_data_path")
        if manifests
        else ("data_path", "train_data_path")
        if args.data_args_path
        else ()
    )
    for key in replaced:
        if recipe.get(key) is not None and getattr(args, key, None) == recipe[key]:
            setattr(args, key, None)
    sources = [
        flag
        for flag, value in (
            ("--data-path", args.data_path),
            ("--data-args-path", args.data_args_path),
            ("--data-manifest", manifests),
        )
        if value
    ]
    if manifests and getattr(args, "train_data_path", None):
        sources.append("--train-data-path")
    if len(sources) > 1:
        raise ValueError(f"give one of {', '.join(sources)} (they all set the training data)")
    if args.data_manifest_weights is not None and not manifests:
        raise ValueError("--data-manifest-weights needs --data-manifest")
    if args.data_args_path:
        args.data_path = read_data_args_file(args.data_args_path)
    if manifests:
        from megatron_fixedcode.tokenizers import tokenizer_from_args

        tokenizer = tokenizer_from_args(args)
        fingerprint = tokenizer.fingerprint if tokenizer is not None else None
        train, valid = blend_from_manifests(
            manifests,
            args.data_manifest_weights,
            fingerprint,
            str(tokenizer.model_path) if tokenizer is not None else None,
        )
        if args.valid_data_path is None:
            args.valid_data_path = valid
        if args.valid_data_path:  # a validation blend of its own: Megatron-LM's per-split paths
            args.train_data_path = train
        else:  # no validation shards: --data-path, split by --split
            args.data_path = train
