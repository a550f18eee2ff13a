"""FixedCodeEmbedding and the model around it, on one rank."""

import dataclasses

import numpy as np
import pytest
import torch

from megatron_fixedcode.codes import CodeSpec
from megatron_fixedcode.compat import ParallelLayout
from megatron_fixedcode.models import (
    FixedCodeEmbedding,
    ModelConfig,
    build_gpt_model,
    build_transformer_config,
    parameter_report,
)

from tests.helpers import skip_unless_kernel_builds

VOCAB = 49152


def tiny(input_embedding="binary", **kw) -> ModelConfig:
    fields = dict(
        num_layers=2,
        hidden_size=40,
        num_attention_heads=4,
        ffn_hidden_size=64,
        seq_length=16,
        vocab_size=VOCAB,
        input_embedding=input_embedding,
    )
    fields.update(kw)
    return ModelConfig(**fields)


def build(single_rank, cfg, **config_overrides):
    torch.manual_seed(7)
    config = build_transformer_config(cfg, ParallelLayout(), **config_overrides)
    return build_gpt_model(cfg, config, single_rank)


def embed_all_ids(model, vocab=VOCAB):
    ids_BS = torch.arange(vocab).reshape(1, -1)
    return model.embedding(ids_BS, None)  # [s, b, h]


@pytest.mark.parametrize("kind,offset", [("binary", 0), ("gf2", 0), ("gf2", 0b1011)])
def test_output_is_scaled_tiled_code_for_every_id(single_rank, kind, offset):
    cfg = tiny(kind, code_offset=offset, code_scale=0.25)
    x_SBH = embed_all_ids(build(single_rank, cfg))
    expected = cfg.code_spec().vectors(np.arange(VOCAB))  # float64 [V, d]
    assert x_SBH.shape == (VOCAB, 1, 40) and x_SBH.dtype == torch.float32
    assert np.array_equal(x_SBH[:, 0].double().numpy(), expected)


@pytest.mark.parametrize("kind", ["binary", "gf2"])
def test_table_free_equals_lookup_bit_for_bit(single_rank, kind):
    table_free = build(single_rank, tiny(kind, code_offset=6, code_impl="table_free"))
    lookup = build(single_rank, tiny(kind, code_offset=6, code_impl="lookup"))
    assert lookup.embedding.codebook_VK.shape == (VOCAB, 16)
    assert table_free.embedding.codebook_VK is None
    assert torch.equal(embed_all_ids(table_free), embed_all_ids(lookup))


@pytest.mark.parametrize("kernel", ["torch", "fused"])
@pytest.mark.parametrize("impl", ["table_free", "lookup"])
@pytest.mark.parametrize(
    "vocab,code_bits,word",
    [
        (200, None, torch.uint8),
        (1000, None, torch.int16),
        (VOCAB, None, torch.int16),
        (VOCAB, 20, torch.int32),
        (3000, 40, torch.int64),
    ],
)
@pytest.mark.slow
@pytest.mark.parametrize("centered,scale,bf16", [(False, 1.0, False), (True, 0.37, True), (False, 3.0, True)])
def test_fast_forward_equals_the_per_bit_reference(
    single_rank, kernel, impl, vocab, code_bits, word, centered, scale, bf16
):
    """The forward (torch: code words → byte-value gather → one tiled write; fused: the compiled CPU
    kernel) against code_bits → bit_values → lift, and against the numpy spec, for every id:
    K of 8/10/16/20/40 bits (hidden 72: a partial last tile), both implementations."""
    from megatron_fixedcode.models.code_embeddings import embedding_class
    from megatron_fixedcode.models.fixed_code_embedding import _code_word_dtype

    skip_unless_kernel_builds(kernel)
    hidden = 72
    cfg = ModelConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=4,
        ffn_hidden_size=16,
        seq_length=8,
        vocab_size=vocab,
        bf16=bf16,
    )
    spec = CodeSpec.create(
        kind="gf2",
        vocab_size=vocab,
        hidden_size=hidden,
        code_bits=code_bits,
        offset=0b101,
        scale=scale,
        implementation=impl,
        centered=centered,
    )
    assert _code_word_dtype(spec.num_bits) == word
    module = embedding_class(spec)(
        build_transformer_config(cfg, ParallelLayout()), spec, tp_group=single_rank.tp, kernel=kernel
    )
    ids_BS = torch.randperm(vocab).reshape(2, -1)  # [b, s] with ids in no particular order
    x_SBH = module(ids_BS)
    reference = module.lift(module.bit_values(module.code_bits(ids_BS.t())))
    assert x_SBH.dtype == reference.dtype == (torch.bfloat16 if bf16 else torch.float32)
    assert torch.equal(x_SBH, reference)
    expected = torch.tensor(spec.vectors(ids_BS.t().numpy())).to(x_SBH.dtype)
    assert torch.equal(x_SBH, expected)


class _FakeTensorParallelGroup:
    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@pytest.mark.parametrize("kernel", ["torch", "fused"])
@pytest.mark.parametrize("impl", ["table_free", "lookup"])
def test_sequence_parallel_rank_computes_exactly_its_slice(single_rank, kernel, impl):
    """Under SP, TP rank r of 2 emits sequence positions [r·S/2, (r+1)·S/2) of the full output."""
    skip_unless_kernel_builds(kernel)
    cfg = tiny("gf2", code_impl=impl, code_kernel=kernel, code_offset=3)
    full = build_transformer_config(cfg, ParallelLayout())
    sp = build_transformer_config(cfg, ParallelLayout(tensor_model_parallel_size=2, sequence_parallel=True))
    ids_BS = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(0))
    x_SBH = FixedCodeEmbedding(full, cfg.code_spec(), tp_group=single_rank.tp, kernel=kernel)(ids_BS)
    for rank in range(2):
        shard = FixedCodeEmbedding(sp, cfg.code_spec(), tp_group=_FakeTensorParallelGroup(rank, 2), kernel=kernel)
        assert torch.equal(shard(ids_BS), x_SBH[8 * rank : 8 * (rank + 1)])


def test_no_trainable_input_parameters_and_report(single_rank):
    model = build(single_rank, tiny("gf2"))
    assert list(model.embedding.parameters()) == []
    assert all(p.requires_grad for p in model.parameters())  # everything else trains, head untied
    report = parameter_report(tiny("gf2"), [model], single_rank)
    learned = parameter_report(tiny("learned"), [build(single_rank, tiny("learned"))], single_rank)
    assert report["input_interface_params"] == 0
    assert learned["input_interface_params"] == VOCAB * 40 == learned["learned_table_params"]
    assert learned["total_params"] - report["total_params"] == VOCAB * 40
    assert report["optimizer_state_bytes_saved"] == VOCAB * 40 * 8


def test_backbone_init_does_not_depend_on_input_interface(single_rank):
    states = {k: build(single_rank, tiny(k)).state_dict() for k in ("learned", "binary", "gf2")}
    backbone = [
        k for k, v in states["binary"].items() if k.startswith(("decoder.", "output_layer.")) and torch.is_tensor(v)
    ]
    assert len(backbone) > 10
    for key in backbone:
        assert torch.equal(states["learned"][key], states["binary"][key]), key
        assert torch.equal(states["gf2"][key], states["binary"][key]), key


@pytest.mark.parametrize("dtype_flags,dtype", [({}, torch.float32), ({"bf16": True}, torch.bfloat16)])
def test_output_dtype_follows_config(single_rank, dtype_flags, dtype):
    cfg = tiny("gf2", **dtype_flags)
    assert embed_all_ids(build(single_rank, cfg), vocab=64).dtype == dtype


@pytest.mark.parametrize("kind", ["binary", "gf2"])
def test_token_zero_only_input_gives_exactly_uniform_logits(single_rank, kind):
    model = build(single_rank, tiny(kind)).eval()
    ids = torch.zeros(2, 16, dtype=torch.long)
    pos = torch.arange(16).expand(2, -1)
    with torch.no_grad():
        logits = model(ids, pos, None)  # [b, s, V_padded]
        assert torch.equal(logits, torch.zeros_like(logits))  # bias-free: zero in, zero out
        shifted = build(single_rank, tiny(kind, code_offset=1)).eval()(ids, pos, None)
        assert shifted.std() > 0  # an offset b != 0 avoids it


@pytest.mark.parametrize("kernel", ["torch", "fused"])
@pytest.mark.parametrize("bad", [1000, -3])
def test_out_of_vocabulary_ids_are_refused(single_rank, kernel, bad):
    skip_unless_kernel_builds(kernel)
    model = build(single_rank, tiny("binary", vocab_size=1000, code_kernel=kernel))
    assert model.embedding.kernel == kernel
    with pytest.raises(ValueError, match=f"input_ids contain {bad}"):
        model.embedding(torch.tensor([[1, bad, 7]]), None)


def test_untied_head_and_no_learned_positions_enforced(single_rank):
    cfg = tiny("binary")
    config = build_transformer_config(cfg, ParallelLayout())
    with pytest.raises(ValueError, match="learned_absolute"):
        FixedCodeEmbedding(config, cfg.code_spec(), position_embedding_type="learned_absolute")
    from megatron_fixedcode.models.builder import build_embedding_factory, build_layer_spec
    from megatron_fixedcode.models.gpt import InputInterfaceGPTModel

    with pytest.raises(ValueError, match="share_embeddings_and_output_weights"):
        InputInterfaceGPTModel(
            embedding_factory=build_embedding_factory(cfg),
            config=config,
            transformer_layer_spec=build_layer_spec(cfg, config),
            vocab_size=49152,
            max_sequence_length=16,
            share_embeddings_and_output_weights=True,
        )


def test_state_dict_carries_code_and_refuses_a_different_code(single_rank):
    gf2 = build(single_rank, tiny("gf2", code_impl="lookup"))
    sd = gf2.state_dict()
    assert {"embedding.row_masks_K", "embedding.offset_K", "embedding.codebook_VK", "embedding._extra_state"} <= set(sd)
    build(single_rank, tiny("gf2", code_impl="lookup")).load_state_dict(sd)  # same code loads
    other = build(single_rank, tiny("gf2", code_impl="lookup", code_seed=1))
    fp_saved, fp_model = tiny("gf2").code_spec().fingerprint, tiny("gf2", code_seed=1).code_spec().fingerprint
    with pytest.raises(ValueError, match=f"{fp_saved}.*{fp_model}"):
        other.load_state_dict(sd)


def test_model_config_errors_name_the_field():
    with pytest.raises(ValueError, match="input_embedding"):
        tiny("hash")
    with pytest.raises(ValueError, match="hidden_size=8"):
        tiny("binary", hidden_size=8, num_attention_heads=2)
    with pytest.raises(ValueError, match="code_bits=8"):
        tiny("gf2", code_bits=8)
    assert dataclasses.replace(tiny("learned"), hidden_size=8, num_attention_heads=2).code_spec() is None


@pytest.mark.parametrize("kind", ["binary", "gf2"])
def test_full_activation_recompute_gives_the_same_gradients(single_rank, kind):
    grads = {}
    for recompute in (None, "full"):
        model = build(single_rank, tiny(kind, recompute_granularity=recompute, vocab_size=1024))
        ids = torch.randint(1, 1024, (2, 17), generator=torch.Generator().manual_seed(0))
        model(ids[:, :-1], torch.arange(16).expand(2, -1), None, labels=ids[:, 1:]).mean().backward()
        grads[recompute] = {n: p.grad for n, p in model.named_parameters()}
    for name, g in grads[None].items():
        assert grads["full"][name] is not None, f"{name} got no gradient under full recompute"
        torch.testing.assert_close(grads["full"][name], g, rtol=1e-6, atol=1e-7)
