"""Parsing and ``--dry-run`` of a paper recipe need no heavy import: a login node's Python may lack torch,
and the tokenizer libraries take seconds to import."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO

HEAVY = ("torch", "tokenizers", "megatron.core", "transformers", "sentencepiece")


def test_parse_and_dry_run_of_a_paper_recipe_import_neither_torch_nor_tokenizers():
    script = (
        "import contextlib, io, json, sys\n"
        "from megatron_fixedcode.arguments.parse import parse_pretrain_args\n"
        "from megatron_fixedcode.pretrain import main\n"
        "argv = ['--config', 'examples/recipes/paper2_1p7b_gf2.yaml', '--dry-run']\n"
        "with contextlib.redirect_stderr(io.StringIO()):\n"
        "    parse_pretrain_args(argv)\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    code = main(argv)\n"
        f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [0, []]
