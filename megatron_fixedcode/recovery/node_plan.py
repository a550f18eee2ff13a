"""The node counts a run can continue on with the same global batch (issue 62): a failed node is cut out and the
job relaunched on fewer nodes, each data-parallel rank accumulating more microbatches, so every step still reads
the same samples (metrics.jsonl's ``samples`` digest shows it). Pure, no torch: the launcher asks it on a login
node, before anything starts.

A node count N fits when N x GPUs per node is a multiple of the model-parallel size (TP x PP x CP) and the
data-parallel size ``dp = N x GPUs / model parallel`` divides the step's ``global batch / micro batch``
microbatches: the sampler then gives each rank ``global batch / (micro batch x dp)`` of them
(data/sampler.py), and the loss and gradient are those of the full-size run up to summation order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

PARALLEL_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size")


@dataclasses.dataclass(frozen=True)
class NodeCount:
    nodes: int
    dp: int
    microbatches: int  # per data-parallel rank and step

    def describe(self) -> str:
        plural = "" if self.microbatches == 1 else "es"
        return f"{self.nodes} (dp {self.dp}, {self.microbatches} microbatch{plural} per rank)"


def _check(**values: int) -> None:
    bad = [f"{k}={v}" for k, v in values.items() if not isinstance(v, int) or v < 1]
    if bad:
        raise ValueError(f"node plan: give whole numbers of 1 or more, got {', '.join(bad)}")


def fits(
    nodes: int, *, gpus_per_node: int, model_parallel: int, global_batch: int, micro_batch: int
) -> NodeCount | None:
    """The layout of ``nodes`` nodes if it keeps the global batch, else None."""
    world = nodes * gpus_per_node
    if world % model_parallel or global_batch % micro_batch:
        return None
    dp, per_step = world // model_parallel, global_batch // micro_batch
    return NodeCount(nodes, dp, per_step // dp) if per_step % dp == 0 else None


def node_counts(
    nodes: int, *, gpus_per_node: int, model_parallel: int, global_batch: int, micro_batch: int, min_nodes: int = 1
) -> list[NodeCount]:
    """Every node count from ``nodes`` down to ``min_nodes`` that keeps the global batch, largest first."""
    _check(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        model_parallel=model_parallel,
        global_batch=global_batch,
        micro_batch=micro_batch,
        min_nodes=min_nodes,
    )
    layout = dict(
        gpus_per_node=gpus_per_node, model_parallel=model_parallel, global_batch=global_batch, micro_batch=micro_batch
    )
    found = (fits(n, **layout) for n in range(nodes, min_nodes - 1, -1))
    return [c for c in found if c is not None]


def choose(
    usable: int, *, gpus_per_node: int, model_parallel: int, global_batch: int, micro_batch: int, min_nodes: int = 1
) -> tuple[NodeCount | None, str]:
    """(the largest node count at most ``usable`` and at least ``min_nodes`` that keeps the global batch, or
    None; one line saying why: what the relaunch runs on, or why it cannot)."""
    _check(usable=usable, min_nodes=min_nodes)
    if usable < min_nodes:
        return None, f"{usable} usable node(s), fewer than MIN_NODES={min_nodes}: no relaunch on fewer nodes"
    counts = node_counts(
        usable,
        gpus_per_node=gpus_per_node,
        model_parallel=model_parallel,
        global_batch=global_batch,
        micro_batch=micro_batch,
        min_nodes=min_nodes,
    )
    if not counts and global_batch % micro_batch:
        return (
            None,
            f"global batch {global_batch} is not a multiple of micro batch {micro_batch}: no node count keeps it",
        )
    if not counts:
        return None, (
            f"no node count from {usable} down to {min_nodes} keeps global batch {global_batch}: its data-parallel "
            f"size (nodes x {gpus_per_node} GPUs / model parallel {model_parallel}) must be whole and divide its "
            f"{global_batch // micro_batch} microbatches of {micro_batch}"
        )
    best = counts[0]
    return best, f"{usable} usable node(s): {best.describe()} keeps global batch {global_batch}"


def from_config(config: dict) -> dict[str, int]:
    """The model-parallel size, global and micro batch of a resolved config (the trainer's ``--dry-run`` JSON)."""
    if config.get("global_batch_size") is None:
        raise ValueError("node plan: the config has no global_batch_size (resolve it with WORLD_SIZE set)")
    model_parallel = 1
    for key in PARALLEL_KEYS:
        model_parallel *= int(config.get(key) or 1)
    return {
        "model_parallel": model_parallel,
        "global_batch": int(config["global_batch_size"]),
        "micro_batch": int(config["micro_batch_size"]),
    }


def list_line(counts: list[NodeCount], global_batch: int, nodes: int, min_nodes: int) -> str:
    """The launcher's dry-run line (after its ``# ``)."""
    listed = ", ".join(c.describe() for c in counts) or f"none from {nodes} down to MIN_NODES={min_nodes}"
    return f"node counts that keep global batch {global_batch}: {listed}"


def main(argv: list[str] | None = None) -> int:
    """Without --usable: the list line (exit 0). With it: the chosen count on stdout and why on stderr (exit 0),
    or why none on stderr (exit 1)."""
    p = argparse.ArgumentParser(prog="python -m megatron_fixedcode.recovery.node_plan", description=__doc__)
    p.add_argument("--config-json", required=True, help="the trainer's --dry-run config: a file, or - for stdin")
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True, help="the full size: the job's node count")
    p.add_argument("--usable", type=int, help="nodes left: print the node count to relaunch on")
    p.add_argument("--min-nodes", type=int, default=1, help="never fewer nodes than this (MIN_NODES)")
    a = p.parse_args(argv)
    try:
        text = sys.stdin.read() if a.config_json == "-" else open(a.config_json).read()
        layout = dict(gpus_per_node=a.gpus_per_node, **from_config(json.loads(text)))
        if a.usable is None:
            counts = node_counts(a.nodes, min_nodes=a.min_nodes, **layout)
            print(list_line(counts, layout["global_batch"], a.nodes, a.min_nodes))
            return 0
        count, why = choose(min(a.usable, a.nodes), min_nodes=a.min_nodes, **layout)
    except (OSError, ValueError, KeyError) as e:  # json's errors are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(why, file=sys.stderr)
    if count is None:
        return 1
    print(count.nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
