"""The node counts that keep the global batch (issue 62's relaunch on fewer nodes), exact cases, and the CLI the
launcher's dry run calls."""

import json
import subprocess
import sys

import pytest

from megatron_fixedcode.recovery.node_plan import NodeCount, choose, from_config, main, node_counts
from tests.helpers import REPO

# 8 GPUs a node, no model parallelism, global batch 512 of micro batch 8: 64 microbatches a step
WIDE = dict(gpus_per_node=8, model_parallel=1, global_batch=512, micro_batch=8)


def test_every_count_that_keeps_the_global_batch_largest_first():
    # 3 nodes: dp 24 does not divide 64 microbatches
    assert node_counts(4, **WIDE) == [NodeCount(4, 32, 2), NodeCount(2, 16, 4), NodeCount(1, 8, 8)]
    assert node_counts(4, min_nodes=2, **WIDE) == [NodeCount(4, 32, 2), NodeCount(2, 16, 4)]
    # paper 2's recipe (128 of 8) on 4 nodes: 4 and 3 are too wide, 2 and 1 fit
    paper2 = dict(WIDE, global_batch=128)
    assert [c.describe() for c in node_counts(4, **paper2)] == [
        "2 (dp 16, 1 microbatch per rank)",
        "1 (dp 8, 2 microbatches per rank)",
    ]
    # TP 2 x PP 2: 3 nodes are 24 GPUs, dp 6
    assert node_counts(3, gpus_per_node=8, model_parallel=4, global_batch=96, micro_batch=2) == [
        NodeCount(3, 6, 8),
        NodeCount(2, 4, 12),
        NodeCount(1, 2, 24),
    ]


def test_the_largest_usable_count_is_chosen():
    count, why = choose(3, **WIDE)
    assert count == NodeCount(2, 16, 4)
    assert why == "3 usable node(s): 2 (dp 16, 4 microbatches per rank) keeps global batch 512"
    assert choose(4, **WIDE)[0] == NodeCount(4, 32, 2)


def test_no_smaller_count_works():
    # TP 8 x PP 2 on 8-GPU nodes: one node cannot hold a model replica
    tp8pp2 = dict(gpus_per_node=8, model_parallel=16, global_batch=64, micro_batch=1)
    assert node_counts(2, **tp8pp2) == [NodeCount(2, 1, 64)]
    count, why = choose(1, **tp8pp2)
    assert count is None
    assert why.startswith("no node count from 1 down to 1 keeps global batch 64: its data-parallel size")
    # min_nodes 3 leaves only 3, where dp 24 does not divide 64 microbatches
    assert choose(3, min_nodes=3, **WIDE)[0] is None
    assert choose(2, **dict(WIDE, global_batch=12, micro_batch=8))[1] == (
        "global batch 12 is not a multiple of micro batch 8: no node count keeps it"
    )


def test_fewer_usable_nodes_than_min_nodes():
    assert choose(1, min_nodes=2, **WIDE) == (
        None,
        "1 usable node(s), fewer than MIN_NODES=2: no relaunch on fewer nodes",
    )
    with pytest.raises(ValueError, match="min_nodes=0"):
        node_counts(4, min_nodes=0, **WIDE)


def test_the_config_names_of_the_trainers_dry_run():
    config = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 4,
        "context_parallel_size": 1,
        "global_batch_size": 256,
        "micro_batch_size": 2,
    }
    assert from_config(config) == {"model_parallel": 8, "global_batch": 256, "micro_batch": 2}
    with pytest.raises(ValueError, match="global_batch_size"):
        from_config({**config, "global_batch_size": None})


def test_the_cli_lists_or_chooses_without_torch(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"global_batch_size": 512, "micro_batch_size": 8, "tensor_model_parallel_size": 1}))
    base = ["--config-json", str(path), "--gpus-per-node", "8", "--nodes", "4"]
    assert main(base) == 0
    assert capsys.readouterr().out == (
        "node counts that keep global batch 512: 4 (dp 32, 2 microbatches per rank), "
        "2 (dp 16, 4 microbatches per rank), 1 (dp 8, 8 microbatches per rank)\n"
    )
    assert main([*base, "--usable", "3"]) == 0
    out = capsys.readouterr()
    assert out.out == "2\n" and "2 (dp 16, 4 microbatches per rank)" in out.err
    assert main([*base, "--usable", "1", "--min-nodes", "2"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "fewer than MIN_NODES=2" in out.err
    assert main([*base, "--min-nodes", "5"]) == 0
    assert capsys.readouterr().out.endswith(": none from 4 down to MIN_NODES=5\n")
    # a login node's launcher: the config on stdin, and torch never imported
    probe = (
        "import sys; from megatron_fixedcode.recovery import node_plan; code = node_plan.main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules; sys.exit(code)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "--config-json", "-", "--gpus-per-node", "8", "--nodes", "2"],
        input=path.read_text(),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("node counts that keep global batch 512: 2 (dp 16, 4 microbatches per rank)")
