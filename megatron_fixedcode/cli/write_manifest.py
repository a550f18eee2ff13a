"""Write OUTPUT_DIR/manifest.json once every shard of a shard-parallel indexing is complete.

    python tools/write_manifest.py /data/fwe_idx [--skip-failed] [--output manifest.json]

Lists every shard's train/valid prefixes (relative to the manifest), token, document and
eligible-document (>= --min-doc-tokens) counts, the tokenizer and its fingerprint and the split
settings. Refuses (exit 2, naming the shards) while a shard is missing, stale or inconsistent,
or failed (unless --skip-failed: then listed under "excluded"). Train with
`--data-manifest OUTPUT_DIR/manifest.json`. See docs/data.md.
"""

import argparse
import sys
import warnings

from megatron_fixedcode.arguments.user_errors import ArgumentParser, user_errors

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")


@user_errors
def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output_dir", help="the --output-dir of tools/preprocess_shards.py plan")
    p.add_argument("--skip-failed", action="store_true", help="leave shards with bad inputs out (listed as excluded)")
    p.add_argument("--output", default=None, help="default OUTPUT_DIR/manifest.json")
    args = p.parse_args(argv)
    from megatron_fixedcode.data.manifest import write_manifest

    manifest, path = write_manifest(args.output_dir, args.skip_failed, args.output)
    for split, t in manifest["totals"].items():
        print(
            f"{split}: {len(manifest['shards'])} shards, {t['documents']} documents, {t['tokens']} tokens, "
            f"{t['eligible_documents']} with >= {manifest['min_doc_tokens']} tokens"
        )
    for e in manifest["excluded"]:
        print(f"excluded {e['name']}: {e['error']}", file=sys.stderr)
    print(f"manifest: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
