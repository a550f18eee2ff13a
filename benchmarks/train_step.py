"""Whole optimizer steps: the megatron-core trainer path vs a plain-PyTorch reference, per input.

For each recipe and input (learned / binary / gf2) two models with the *same weights* train on
the *same batch* in one process, their steps alternating (``common.time_interleaved``):

* ``megatron`` — the trainer's path: ``build_model_chunks`` (GPTModel in megatron DDP with its
  contiguous grad buffer), ``get_megatron_optimizer`` (clip 1.0, wd 0.01 on matrices), and
  ``forward_backward`` (megatron's pipeline schedule), exactly as ``training/loop.py`` wires them;
* ``torch`` — a minimal single-process loop with torch's own modules: ``nn.RMSNorm``, SwiGLU MLP,
  ``scaled_dot_product_attention`` with RoPE, untied head, ``AdamW(fused=True)``, clip 1.0.

Both first-step losses are reported: equal losses show the two are the same model. Tokens/s is
``global batch × seq / median step time``; peak memory is tensor bytes (``common.TensorBytes``).
On a GPU the same script reports TFLOP/s and MFU (BF16; FP8 when Transformer Engine is present).

Shape legend: B batch, S sequence, H hidden, N heads, D head dim, F FFN, V padded vocabulary.

Run: ``python benchmarks/train_step.py [--recipe tiny mid] [--json] [--repeats N]``.
"""

from __future__ import annotations

import megatron_fixedcode  # noqa: F401  (first: its megatron-core compatibility patches, compat/)

# isort: split
import argparse
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import (  # noqa: E402
    MIB,
    TensorBytes,
    emit,
    gradient_tensors,
    machine,
    optimizer_state_tensors,
    storage_bytes,
    time_interleaved,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: E402
from torch import nn  # noqa: E402

from megatron_fixedcode.compat import ParallelLayout, initialize_distributed  # noqa: E402
from megatron_fixedcode.models import ModelConfig, build_transformer_config, parameter_report  # noqa: E402
from megatron_fixedcode.models.cost import model_flops_per_token  # noqa: E402
from megatron_fixedcode.training.forward_backward import forward_backward  # noqa: E402
from megatron_fixedcode.training.model_chunks import build_model_chunks  # noqa: E402

# name: model shape, micro batch, global batch (on one rank: global // micro microbatches)
RECIPES = {
    "tiny": dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        seq_length=64,
        micro_batch_size=4,
        global_batch_size=8,
    ),  # examples/recipes/tiny_cpu.yaml
    "mid": dict(
        num_layers=8,
        hidden_size=512,
        num_attention_heads=8,
        ffn_hidden_size=2048,
        seq_length=256,
        micro_batch_size=2,
        global_batch_size=4,
    ),
}
INPUTS = ("learned", "binary", "gf2")
LR, WD, BETAS, EPS, CLIP = 1e-4, 0.01, (0.9, 0.95), 1e-8, 1.0


# --- the plain-PyTorch reference -----------------------------------------------------------
def rope_cos_sin(seq: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq_D2 = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs_SD = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq_D2).repeat(1, 2)
    return freqs_SD.cos(), freqs_SD.sin()


def apply_rope(x_BNSD, cos_SD, sin_SD):
    x1, x2 = x_BNSD.chunk(2, dim=-1)
    return x_BNSD * cos_SD + torch.cat((-x2, x1), dim=-1) * sin_SD


class Block(nn.Module):
    def __init__(self, h: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.heads = heads
        self.input_layernorm = nn.RMSNorm(h, eps=eps)
        self.linear_qkv = nn.Linear(h, 3 * h, bias=False)  # per head [q, k, v], as megatron lays it out
        self.linear_proj = nn.Linear(h, h, bias=False)
        self.pre_mlp_layernorm = nn.RMSNorm(h, eps=eps)
        self.linear_fc1 = nn.Linear(h, 2 * ffn, bias=False)  # [gate; up]
        self.linear_fc2 = nn.Linear(ffn, h, bias=False)

    def forward(self, x_BSH, cos_SD, sin_SD):
        b, s, h = x_BSH.shape
        qkv = self.linear_qkv(self.input_layernorm(x_BSH)).view(b, s, self.heads, 3, h // self.heads)
        q_BNSD, k_BNSD, v_BNSD = (t.transpose(1, 2) for t in qkv.unbind(3))
        a_BNSD = F.scaled_dot_product_attention(
            apply_rope(q_BNSD, cos_SD, sin_SD), apply_rope(k_BNSD, cos_SD, sin_SD), v_BNSD, is_causal=True
        )
        x_BSH = x_BSH + self.linear_proj(a_BNSD.transpose(1, 2).reshape(b, s, h))
        gate_BSF, up_BSF = self.linear_fc1(self.pre_mlp_layernorm(x_BSH)).chunk(2, dim=-1)
        return x_BSH + self.linear_fc2(F.silu(gate_BSF) * up_BSF)


class TorchGPT(nn.Module):
    """The same network as megatron's GPTModel with the local llama spec, batch-first."""

    def __init__(self, cfg: ModelConfig, padded_vocab: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.norm_epsilon
        spec = cfg.code_spec()
        if spec is None:
            self.embedding = nn.Embedding(padded_vocab, h)
        else:  # the fixed code in plain torch: gather K bits, tile to the width, scale
            self.register_buffer("codebook_VK", torch.from_numpy(spec.codebook()).float() * spec.scale)
            self.embedding = None
        self.layers = nn.ModuleList(
            Block(h, cfg.num_attention_heads, cfg.ffn_hidden_size, eps) for _ in range(cfg.num_layers)
        )
        self.final_layernorm = nn.RMSNorm(h, eps=eps)
        self.output_layer = nn.Linear(h, padded_vocab, bias=False)
        cos_SD, sin_SD = rope_cos_sin(cfg.seq_length, h // cfg.num_attention_heads, cfg.rotary_base)
        self.register_buffer("cos_SD", cos_SD, persistent=False)
        self.register_buffer("sin_SD", sin_SD, persistent=False)

    def embed(self, tokens_BS):
        if self.embedding is not None:
            return self.embedding(tokens_BS)
        h, k = self.output_layer.in_features, self.codebook_VK.shape[1]
        return F.embedding(tokens_BS, self.codebook_VK).repeat(1, 1, -(-h // k))[..., :h]

    def forward(self, tokens_BS, labels_BS):
        x_BSH = self.embed(tokens_BS)
        for layer in self.layers:
            x_BSH = layer(x_BSH, self.cos_SD, self.sin_SD)
        logits_BSV = self.output_layer(self.final_layernorm(x_BSH))
        return F.cross_entropy(logits_BSV.flatten(0, 1).float(), labels_BS.flatten())

    def load_megatron(self, gpt) -> None:
        """Copy the weights of a megatron GPTModel (names match after dropping the prefixes)."""
        ours = dict(self.named_parameters())
        for name, param in gpt.named_parameters():
            key = (
                name.replace("decoder.layers.", "layers.")
                .replace("decoder.final_layernorm", "final_layernorm")
                .replace("self_attention.", "")
                .replace("mlp.", "")
                .replace("embedding.word_embeddings", "embedding")
            )
            with torch.no_grad():
                ours.pop(key).copy_(param)
        assert not ours, f"reference parameters without a megatron source: {sorted(ours)}"


class TorchRunner:
    def __init__(self, model: TorchGPT, batch: list[dict]):
        self.model, self.batch = model, batch
        decay = [p for p in model.parameters() if p.dim() > 1]
        no_decay = [p for p in model.parameters() if p.dim() <= 1]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
            lr=LR,
            betas=BETAS,
            eps=EPS,
            fused=True,
        )
        self.losses = []

    def step(self):
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for mb in self.batch:
            loss = self.model(mb["tokens"], mb["labels"]) / len(self.batch)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP, foreach=True)
        self.optimizer.step()
        self.losses.append(total)

    def state_tensors(self):
        return [
            *self.model.parameters(),
            *self.model.buffers(),
            *gradient_tensors([self.model]),
            *optimizer_state_tensors(self.optimizer),
        ]


# --- the megatron trainer path --------------------------------------------------------------
class MegatronRunner:
    def __init__(self, cfg: ModelConfig, pg, batch: list[dict], bf16: bool, fp8: bool):
        overrides = {"fp8": "hybrid"} if fp8 else {}
        config = build_transformer_config(cfg, ParallelLayout(), **overrides)
        self.chunks = build_model_chunks(cfg, config, ParallelLayout(), pg)
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=LR,
                weight_decay=WD,
                adam_beta1=BETAS[0],
                adam_beta2=BETAS[1],
                adam_eps=EPS,
                clip_grad=CLIP,
                bf16=bf16,
                params_dtype=torch.float32,
            ),
            self.chunks,
        )
        self.cfg, self.batch, self.losses = cfg, batch, []

    def step(self):  # Trainer.train_step without the data fetch and the LR scheduler
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        total, count = forward_backward(
            self.chunks,
            self.batch,
            num_microbatches=len(self.batch),
            seq_length=self.cfg.seq_length,
            micro_batch_size=self.batch[0]["tokens"].shape[0],
        )
        self.optimizer.step()
        self.losses.append(total / count)

    def gpt(self):
        module = self.chunks[0].module
        return getattr(module, "module", module)  # under Float16Module one level deeper

    def state_tensors(self):
        return [
            *self.gpt().parameters(),
            *self.gpt().buffers(),
            *gradient_tensors([self.gpt()]),
            *[b.grad_data for c in self.chunks for b in c.buffers],
            *optimizer_state_tensors(self.optimizer),
        ]


def make_batch(cfg: ModelConfig, micro: int, num_micro: int, device) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    batch = []
    for _ in range(num_micro):
        seq_BS = torch.randint(0, cfg.vocab_size, (micro, cfg.seq_length + 1), generator=g).to(device)
        batch.append(
            {
                "tokens": seq_BS[:, :-1].contiguous(),
                "labels": seq_BS[:, 1:].contiguous(),
                "loss_mask": torch.ones(micro, cfg.seq_length, device=device),
            }
        )
    return batch


def peak_bytes(runner) -> dict:
    resident = storage_bytes(runner.state_tensors())
    with TensorBytes() as tracker:
        runner.step()
    return {"resident_bytes": resident, "peak_bytes": resident + tracker.peak}


def run_recipe(name: str, vocab: int, repeats: int, pg, bf16: bool, fp8: bool, peak_tflops: float) -> dict:
    r = dict(RECIPES[name])
    micro, global_batch = r.pop("micro_batch_size"), r.pop("global_batch_size")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runners, out = (
        {},
        {
            "recipe": name,
            **r,
            "vocab_size": vocab,
            "micro_batch_size": micro,
            "global_batch_size": global_batch,
            "tokens_per_step": global_batch * r["seq_length"],
        },
    )
    cfgs = {}
    for inp in INPUTS:
        cfg = cfgs[inp] = ModelConfig(**r, vocab_size=vocab, input_embedding=inp, transformer_impl="auto", bf16=bf16)
        batch = make_batch(cfg, micro, global_batch // micro, device)
        torch.manual_seed(1234)
        mega = MegatronRunner(cfg, pg, batch, bf16, fp8)
        ref = TorchGPT(cfg, cfg.padded_vocab_size()).to(device)
        ref.load_megatron(mega.gpt())
        runners[f"megatron_{inp}"], runners[f"torch_{inp}"] = mega, ref_runner = mega, TorchRunner(ref, batch)
        if bf16:
            ref_runner.model.forward = torch.autocast(device, dtype=torch.bfloat16)(ref_runner.model.forward)
    for runner in runners.values():  # first step: optimizer state, grads; its loss checks the twins
        runner.step()
    memory = {n: peak_bytes(rn) for n, rn in runners.items()}
    times = time_interleaved({n: rn.step for n, rn in runners.items()}, repeats, warmup=0)
    for n, rn in runners.items():
        tps = out["tokens_per_step"] / times[n]["wall_s"]
        out[n] = {
            "step_s": times[n]["wall_s"],
            "step_cpu_s": times[n]["cpu_s"],
            "tokens_per_s": tps,
            "tokens_per_cpu_s": out["tokens_per_step"] / times[n]["cpu_s"],
            "first_loss": rn.losses[0],
            **memory[n],
        }
        if device == "cuda":  # the torch twin is the same model: the megatron twin's count serves both
            inp = n.split("_", 1)[1]
            report = parameter_report(cfgs[inp], runners[f"megatron_{inp}"].chunks, pg)
            flops = model_flops_per_token(report, r["num_layers"], r["hidden_size"], r["seq_length"])
            out[n]["tflops"] = flops * tps / 1e12
            out[n]["mfu"] = out[n]["tflops"] / peak_tflops
    table_bytes = cfg.padded_vocab_size() * r["hidden_size"] * 4
    for inp in INPUTS:
        out[f"megatron_over_torch_{inp}"] = out[f"megatron_{inp}"]["tokens_per_s"] / out[f"torch_{inp}"]["tokens_per_s"]
        out[f"megatron_over_torch_cpu_{inp}"] = (
            out[f"megatron_{inp}"]["tokens_per_cpu_s"] / out[f"torch_{inp}"]["tokens_per_cpu_s"]
        )
        out[f"first_loss_rel_diff_{inp}"] = (
            abs(out[f"megatron_{inp}"]["first_loss"] - out[f"torch_{inp}"]["first_loss"])
            / out[f"torch_{inp}"]["first_loss"]
        )
    for path in ("megatron", "torch"):
        for inp in ("binary", "gf2"):
            out[f"{path}_{inp}_over_learned_tokens_per_s"] = (
                out[f"{path}_{inp}"]["tokens_per_s"] / out[f"{path}_learned"]["tokens_per_s"]
            )
            out[f"{path}_{inp}_over_learned_tokens_per_cpu_s"] = (
                out[f"{path}_{inp}"]["tokens_per_cpu_s"] / out[f"{path}_learned"]["tokens_per_cpu_s"]
            )
            out[f"{path}_{inp}_peak_saving_bytes"] = (
                out[f"{path}_learned"]["peak_bytes"] - out[f"{path}_{inp}"]["peak_bytes"]
            )
    inner = getattr(
        runners["megatron_learned"].optimizer, "chained_optimizers", [runners["megatron_learned"].optimizer]
    )
    torch_opt = getattr(inner[0], "optimizer", inner[0])
    out["megatron_optimizer"] = {
        "class": type(torch_opt).__name__,
        "fused": torch_opt.defaults.get("fused"),
        "foreach": torch_opt.defaults.get("foreach"),
    }
    out["table_state_bytes"] = table_bytes * 4  # weight + grad + Adam exp_avg + exp_avg_sq, FP32
    out["load_average"] = times["load_average"]
    return out


def table(res: dict) -> str:
    lines = [f"threads={res['machine']['torch_threads']} load={res['machine']['load_average']}"]
    for r in res["recipes"]:
        lines.append(
            f"\n{r['recipe']}: {r['num_layers']}x{r['hidden_size']} seq {r['seq_length']} V={r['vocab_size']} "
            f"global batch {r['global_batch_size']} (micro {r['micro_batch_size']}) load {r['load_average']}"
        )
        lines.append(
            f"{'run':18s} {'tokens/s':>10s} {'tok/CPU-s':>10s} {'step ms':>9s} {'peak MiB':>9s} {'first loss':>11s}"
        )
        for n in (f"{p}_{i}" for i in INPUTS for p in ("megatron", "torch")):
            v = r[n]
            lines.append(
                f"{n:18s} {v['tokens_per_s']:10.0f} {v['tokens_per_cpu_s']:10.0f} {v['step_s'] * 1e3:9.1f} {v['peak_bytes'] / MIB:9.1f} "
                f"{v['first_loss']:11.6f}" + (f"  {v['tflops']:.1f} TFLOP/s MFU {v['mfu']:.1%}" if "mfu" in v else "")
            )
        lines.append(
            "megatron/torch tokens/s (wall; CPU time): "
            + "  ".join(
                f"{i} {r[f'megatron_over_torch_{i}']:.2f}; {r[f'megatron_over_torch_cpu_{i}']:.2f}" for i in INPUTS
            )
        )
        lines.append(
            "binary/learned tokens/s (wall; CPU time): "
            + "  ".join(
                f"{p} {r[f'{p}_binary_over_learned_tokens_per_s']:.2f}; {r[f'{p}_binary_over_learned_tokens_per_cpu_s']:.2f}"
                for p in ("megatron", "torch")
            )
        )
        lines.append(
            f"peak saving binary vs learned: megatron {r['megatron_binary_peak_saving_bytes'] / MIB:.1f} MiB, "
            f"torch {r['torch_binary_peak_saving_bytes'] / MIB:.1f} MiB; table state {r['table_state_bytes'] / MIB:.1f} MiB"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", nargs="+", choices=sorted(RECIPES), default=["tiny", "mid"])
    p.add_argument("--vocab-size", type=int, default=49152, help="the SmolLM2 tokenizer's (paper 2)")
    p.add_argument("--repeats", type=int, default=None, help="timed steps per run (median reported)")
    p.add_argument("--smoke", action="store_true", help="tiny recipe, small vocabulary, 2 steps; for tests")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="GPU dense BF16 peak for MFU (H100/H200: 989)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    recipes, vocab, repeats = (["tiny"], 4096, 2) if a.smoke else (a.recipe, a.vocab_size, a.repeats or 5)
    pg = initialize_distributed(ParallelLayout())
    on_gpu = torch.cuda.is_available()
    fp8 = on_gpu and importlib.util.find_spec("transformer_engine") is not None
    results = {"benchmark": "train_step", "machine": machine(), "repeats": repeats, "recipes": []}
    for name in recipes:
        results["recipes"].append(
            run_recipe(name, vocab, repeats, pg, bf16=False, fp8=False, peak_tflops=a.peak_tflops)
        )
        if on_gpu:  # BF16 (and FP8 with Transformer Engine) on GPUs only; untested on CPU machines
            results["recipes"].append(
                {**run_recipe(name, vocab, repeats, pg, True, False, a.peak_tflops), "precision": "bf16"}
            )
            if fp8:
                results["recipes"].append(
                    {**run_recipe(name, vocab, repeats, pg, True, True, a.peak_tflops), "precision": "fp8"}
                )
    emit(results, a.json, table)


if __name__ == "__main__":
    main()
