"""Analyze a trained checkpoint on CPU: activation statistics by token across depth, layer ablation,
activation patching and linear probes; writes OUTPUT/analysis.json and PNG plots.

    python tools/analyze_model.py --load runs/replication/checkpoints/binary_s1 --output-dir runs/analysis/binary
"""

import argparse
import json
import sys
import warnings

from megatron_fixedcode.arguments.user_errors import ArgumentParser

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*", category=UserWarning)


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load", required=True, help="trainer --save directory (or one iter_* directory)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--data-path", default=None, help="indexed dataset prefix (default: the run's validation data)")
    p.add_argument("--num-windows", type=int, default=32)
    p.add_argument("--seq-length", type=int, default=None)
    p.add_argument("--probe-classes", type=int, default=32)
    p.add_argument("--patch-length", type=int, default=24)
    p.add_argument("--patch-position", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from megatron_fixedcode.analysis.run import AnalysisConfig, run_analysis

    try:
        cfg = AnalysisConfig(**{k: v for k, v in vars(a).items()})
        report = run_analysis(cfg)
    except ValueError as e:
        p.error(str(e))
    summary = {
        "step": report["step"],
        "input_embedding": report["input_embedding"],
        "loss": report["ablation"]["loss"],
        "plots": report["plots"],
        "ablation_delta": [round(b["delta"], 4) for b in report["ablation"]["blocks"]],
        "token_variance_fraction": [round(s["token_variance_fraction"], 3) for s in report["activations"]["sites"]],
    }
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
