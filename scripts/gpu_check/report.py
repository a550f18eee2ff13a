"""Collect what scripts/gpu_check.sh did into OUT/gpu_check.json and OUT/gpu_check.md.

    python scripts/gpu_check/report.py stage OUT NAME STATUS SECONDS [DETAIL]   # append one stage
    python scripts/gpu_check/report.py write OUT                               # the JSON + markdown
    python scripts/gpu_check/report.py fake OUT                                # fake inputs, then write (dry run)

Inputs under OUT: stages.jsonl (one line per stage: ok / failed / skipped / not_run + why),
env.json (env_report.py), pytest-gpu.xml (JUnit of `pytest -m gpu`), bench-<variant>.json
(bench.py), compile-<variant>.json (bench.py --warm), ckpt.json (ckpt_roundtrip.py). Nothing
missing is dropped silently: a missing input is listed as such, and a failed stage's reason is in
the stages table.
"""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def add_stage(out: Path, name: str, status: str, seconds: str, detail: str = "") -> None:
    from plan import STAGES

    assert status in ("ok", "failed", "skipped", "not_run"), status
    budget = dict((s, b) for s, b, _, _ in STAGES).get(name)
    with open(out / "stages.jsonl", "a") as f:
        f.write(
            json.dumps(
                {
                    "stage": name,
                    "status": status,
                    "seconds": round(float(seconds), 1),
                    "budget_s": budget,
                    "detail": detail,
                }
            )
            + "\n"
        )


def read_junit(path: Path) -> dict:
    if not path.exists():
        return {"missing": str(path.name)}
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (
                    (node.get("message") or node.text or "").strip().splitlines()[0][:300]
                    if (node.get("message") or node.text)
                    else ""
                )
                break
        cases.append(
            {
                "test": f"{case.get('classname', '')}::{case.get('name')}",
                "outcome": outcome,
                "seconds": round(float(case.get("time") or 0), 1),
                "message": message,
            }
        )
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    return {"counts": counts, "cases": cases}


def collect(out: Path) -> dict:
    stages = (
        [json.loads(ln) for ln in (out / "stages.jsonl").read_text().splitlines()]
        if (out / "stages.jsonl").exists()
        else []
    )
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {"missing": "env.json"}
    order = ["binary", "gf2", "learned", "binary_bf16", "te", "te_autocast", "te_fp8"]
    bench = sorted(
        (json.loads(p.read_text()) for p in out.glob("bench-*.json")),
        key=lambda b: order.index(b["variant"]) if b.get("variant") in order else len(order),
    )
    compiled = [json.loads(p.read_text()) for p in sorted(out.glob("compile-*.json"))]
    ckpt = json.loads((out / "ckpt.json").read_text()) if (out / "ckpt.json").exists() else {"missing": "ckpt.json"}
    from plan import STAGES, TOTAL_LIMIT_S

    return {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "env": env,
        "stages": stages,
        "plan": {
            "stages": [{"stage": s, "budget_s": b, "when": w} for s, b, w, _ in STAGES],
            "total_limit_s": TOTAL_LIMIT_S,
        },
        "tests": read_junit(out / "pytest-gpu.xml"),
        "benchmark": bench,
        "compile": compiled,
        "checkpoint": ckpt,
    }


def _fmt(v, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def markdown(r: dict) -> str:
    env = r["env"]
    lines = [
        "# GPU check",
        "",
        f"Generated {r['generated']} by `scripts/gpu_check.sh`.",
        "",
        "## Machine",
        "",
        f"- GPU: {env.get('gpu', '—')} ({env.get('gpu_memory_gib', '—')} GiB, sm {env.get('compute_capability', '—')}), "
        f"{env.get('gpu_count', 0)} visible",
        f"- Python {env.get('python', '—')}, torch {env.get('torch', '—')} (CUDA {env.get('torch_cuda', '—')}), "
        f"megatron-core {env.get('megatron_core', '—')}",
        f"- Transformer Engine: {env.get('transformer_engine') or 'not installed'}"
        + (
            ""
            if env.get("transformer_engine_importable")
            else f" — not importable: {env.get('transformer_engine_error', '')}"
        ),
        f"- apex: {'yes' if env.get('apex') else 'no'}",
        f"- python: {env.get('python_executable', '—')}; torch.compile: "
        f"{(env.get('compile') or {}).get('reason', '—')}",
        "- Not measurable by this check: Transformer Engine cannot travel (its wheels are far over the 64 MiB "
        "carry), so TE layers, FP8 and context parallelism are measured only where the machine has TE.",
    ]
    if "missing" in env:
        lines.append("- env.json is missing: the env stage's reason is in the stages table (env.log)")
    if env.get("fp8_support"):
        lines.append("- FP8 recipes on this GPU: " + ", ".join(f"{k} {v}" for k, v in env["fp8_support"].items()))
    lines += ["", "## Stages", "", "| stage | status | seconds | budget s | detail |", "|---|---|---|---|---|"]
    lines += [
        f"| {s['stage']} | {s['status']} | {s['seconds']} | {s.get('budget_s') or '—'} | {s['detail']} |"
        for s in r["stages"]
    ]
    t = r["tests"]
    lines += ["", "## GPU-marked tests (`pytest -m gpu`)", ""]
    if "missing" in t:
        lines.append(f"No test results ({t['missing']} missing): see the stages above.")
    else:
        lines.append(", ".join(f"{n} {k}" for k, n in t["counts"].items()))
        lines += ["", "| test | outcome | seconds | message |", "|---|---|---|---|"]
        lines += [f"| `{c['test']}` | {c['outcome']} | {c['seconds']} | {c['message']} |" for c in t["cases"]]
    lines += ["", "## Throughput: the paper-2 block on one GPU", ""]
    if not r["benchmark"]:
        lines.append("No benchmark results: see the stages above.")
    else:
        b0 = r["benchmark"][0]
        lines += [
            f"The paper-2 recipe (h {b0.get('hidden_size', 2048)}, FFN {b0.get('ffn_hidden_size', 8192)} SwiGLU, "
            f"{b0.get('num_attention_heads', 32)} heads) at "
            f"{b0.get('num_layers', '?')} of 24 layers, micro batch {b0.get('micro_batch_size', 8)} × "
            f"{b0.get('seq_length', 2048)}, global batch {b0.get('global_batch_size', 8)} (no accumulation), "
            f"recompute {b0.get('recompute_granularity') or 'none'}, {b0.get('optimizer', '?')}; median of the "
            "timed steps. Model FLOPs/token = 6·N(blocks + head) + 12·L·h·s (the input table is a lookup: "
            "learned and binary are credited the same work); MFU over "
            f"{_fmt(b0.get('peak_bf16_tflops'), '.1f')} TFLOP/s (the GPU's dense BF16 peak). "
            "'24 layers' is a projection at the same MFU, not a measurement. Placement: the devices of the "
            "parameters and buffers of trainer.chunks after the steps and of the batch tensors the model "
            "was called with.",
            "",
            "| variant | precision | layers | fusions | timed steps | first step s | step s | tokens/s | "
            "model TFLOP/s | MFU | tokens/s at 24 layers (projected) | peak alloc GiB | peak reserved GiB | "
            "placement |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for b in r["benchmark"]:
            impl = b.get("transformer_impl", "?") + (f" + FP8 {b['fp8']}" if b.get("fp8") else "")
            where = b.get("placement") or {}
            devices = sorted(
                {*where.get("parameters", {}), *where.get("buffers", {}), *where.get("batch", {}).values()}
            )
            place = (
                "all on " + ", ".join(devices)
                if where.get("all_on_cuda")
                else "NOT all on CUDA: " + "; ".join(where.get("not_on_cuda", [])[:3])
                if where
                else "—"
            )
            fusions = ", ".join(k for k, v in (b.get("fusions") or {}).items() if v) or "none"
            lines.append(
                f"| {b['variant']} | {b.get('precision', '?')} | {b.get('num_layers', '?')} {impl} | {fusions} | "
                f"{b.get('timed_steps', '—')} | {_fmt(b.get('first_step_s'), '.1f')} | {b['step_time_s']:.3f} | "
                f"{b['tokens_per_s']:,.0f} | {b['model_tflops_per_s']:.1f} | "
                f"{_fmt(b['mfu'] and 100 * b['mfu'], '.1f')}% | "
                f"{_fmt(b.get('tokens_per_s_24_layers_at_this_mfu'), ',.0f')} | "
                f"{b['peak_memory_allocated_gib']:.1f} | {b['peak_memory_reserved_gib']:.1f} | {place} |"
            )
    if r["benchmark"]:
        lines += ["", "Trainer flags, to read against the recipe (the recipe file, then what overrides it):", ""]
        lines += [f"- {b['variant']}: `{' '.join(b['trainer_argv'])}`" for b in r["benchmark"] if b.get("trainer_argv")]
    lines += ["", "## Compile (torch.compile of megatron-core's fused SwiGLU and bias-dropout-add)", ""]
    lines += [
        f"- {c['variant']} ({c.get('precision')}): first step {_fmt(c.get('first_step_s'), '.1f')} s at 1 layer "
        f"(build + cold compile), fusions {', '.join(k for k, v in (c.get('fusions') or {}).items() if v) or 'none'}"
        for c in r.get("compile", [])
    ] or ["No compile results: see the compile stage above."]
    ck = r.get("checkpoint") or {}
    lines += ["", "## Distributed checkpoint: save + load on the GPU", ""]
    if "missing" in ck:
        lines.append(f"No result ({ck['missing']} missing): see the ckpt stage above.")
    else:
        lines.append(
            f"{ck.get('num_layers')} layer(s), binary, the recipe's precision and distributed optimizer: "
            f"4 steps saving at step 2 (exit {ck.get('save_run_rc')}, {_fmt(ck.get('save_run_s'), '.0f')} s, "
            f"{_fmt((ck.get('checkpoint_bytes') or 0) / 2**30, '.2f')} GiB), then load step 2 and redo 3-4 "
            f"(exit {ck.get('load_run_rc')}, {_fmt(ck.get('load_run_s'), '.0f')} s): "
            f"**{'bit-identical' if ck.get('identical_after_load') else 'NOT identical'}**."
        )
        lines += ["", "| step | uninterrupted loss, grad norm | after the load |", "|---|---|---|"]
        lines += [
            f"| {k} | {v.get('uninterrupted')} | {v.get('loaded')} |"
            for k, v in (ck.get("steps_after_load") or {}).items()
        ]
    return "\n".join(lines) + "\n"


def write(out: Path) -> dict:
    r = collect(out)
    (out / "gpu_check.json").write_text(json.dumps(r, indent=1))
    (out / "gpu_check.md").write_text(markdown(r))
    return r


def fake(out: Path) -> dict:
    """Fake inputs with the real writers: the dry run's check that the report path works."""
    from bench import summarize

    out.mkdir(parents=True, exist_ok=True)
    (out / "env.json").write_text(
        json.dumps(
            {
                "python": "3.12.0",
                "torch": "0.0-fake",
                "gpu": "FAKE H200",
                "cuda_available": True,
                "transformer_engine_importable": False,
                "transformer_engine_error": "fake",
            }
        )
    )
    (out / "pytest-gpu.xml").write_text(
        '<testsuites><testsuite name="pytest"><testcase classname="tests.test_fake" name="test_ok" time="1.0"/>'
        '<testcase classname="tests.test_fake" name="test_skip" time="0"><skipped message="fake skip"/></testcase>'
        "</testsuite></testsuites>"
    )
    placed = {
        "parameters": {"cuda:0": 3},
        "buffers": {"cuda:0": 1},
        "batch": {"arg0": "cuda:0"},
        "all_on_cuda": True,
        "not_on_cuda": [],
    }
    for variant, step in (("binary", 0.68), ("gf2", 0.68), ("learned", 0.70), ("binary_bf16", 0.5)):
        result = summarize(
            variant=variant,
            gpu="NVIDIA H200 (fake)",
            step_times=[step, step + 0.01, step - 0.01],
            tokens_per_step=16384,
            flops_tok=6 * 0.369e9 + 12 * 4 * 2048 * 2048,
            peak_alloc=40 * 2**30,
            peak_reserved=44 * 2**30,
            extra={
                "transformer_impl": "fake",
                "fp8": None,
                "num_layers": 4,
                "timed_steps": 3,
                "placement": placed,
                "model_flops_per_token_24_layers": 11.5e9,
                "precision": "bf16" if variant.endswith("bf16") else "fp32-autocast-bf16",
                "fusions": {"bias_activation_fusion": True},
                "first_step_s": 9.0,
            },
        )
        (out / f"bench-{variant}.json").write_text(json.dumps(result))
    (out / "compile-binary.json").write_text(
        json.dumps(
            {
                "variant": "binary",
                "precision": "fp32-autocast-bf16",
                "first_step_s": 30.0,
                "fusions": {"bias_dropout_fusion": True},
            }
        )
    )
    step = {"loss": 10.9, "grad_norm": 3.2}
    (out / "ckpt.json").write_text(
        json.dumps(
            {
                "num_layers": 1,
                "save_run_rc": 0,
                "load_run_rc": 0,
                "save_run_s": 20,
                "load_run_s": 15,
                "checkpoint_bytes": 2**31,
                "identical_after_load": True,
                "steps_after_load": {"3": {"uninterrupted": step, "loaded": step}},
            }
        )
    )
    add_stage(out, "fake", "ok", "0", "dry run: fake numbers")
    return write(out)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "stage":
        add_stage(Path(argv[1]), *argv[2:6])
    elif len(argv) == 2 and argv[0] == "write":
        print(markdown(write(Path(argv[1]))))
    elif len(argv) == 2 and argv[0] == "fake":
        r = fake(Path(argv[1]))
        assert r["benchmark"] and r["tests"]["counts"]["passed"] == 1 and r["tests"]["counts"]["skipped"] == 1
        print(markdown(r))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
