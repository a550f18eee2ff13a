"""The code families as pure math: injectivity at the activation dtype (or a loud refusal), the
bf16 emulation against torch, norm matching, fingerprints (the paper codes' stay pinned)."""

import json

import numpy as np
import pytest
import torch

from megatron_fixedcode.codes import (
    CODE_KINDS,
    CodeSpec,
    duplicate_rows,
    min_pairwise_distance,
    quantize,
)
from megatron_fixedcode.codes.analysis import analyze_code

V = 49152  # the SmolLM2 vocabulary
FLOAT_KINDS = ("random", "sinusoidal", "lowdim")


def spec(kind, vocab_size=V, hidden_size=128, **kw):
    return CodeSpec.create(kind=kind, vocab_size=vocab_size, hidden_size=hidden_size, **kw)


def test_registry_lists_every_input_interface():
    assert CODE_KINDS == ("binary", "gf2", "random", "sinusoidal", "lowdim")


def test_paper_fingerprints_unchanged():
    # docs/codes.md and checkpoints of the paper configuration carry these.
    assert spec("gf2", hidden_size=2048).fingerprint == "977ba5f1ef736b2b"
    assert spec("binary", hidden_size=2048).fingerprint == "cc3c46077abc6328"


@pytest.mark.parametrize("kind", FLOAT_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float_codes_injective_on_the_vocabulary_at_the_dtype(kind, dtype):
    s = spec(kind, dtype=dtype)
    assert s.num_bits == 16 and s.implementation == "lookup"
    rows = quantize(s.input_table(), dtype)
    assert duplicate_rows(rows) == []
    # the numpy bf16 emulation is what torch does to the model's float32 buffer
    torch_rows = torch.from_numpy(s.input_table()).to(getattr(torch, dtype)).float().numpy()
    assert np.array_equal(rows, torch_rows)


@pytest.mark.parametrize("kind,width", [("random", 2), ("sinusoidal", 2), ("lowdim", 2)])
def test_collisions_at_bf16_are_refused_naming_the_tokens(kind, width):
    spec(kind, code_bits=width)  # float32 keeps them apart ...
    with pytest.raises(ValueError, match=r"not injective at bfloat16: tokens \d+ and \d+"):
        spec(kind, code_bits=width, dtype="bfloat16")  # ... bf16 does not


def test_bit_codes_refuse_a_scale_that_vanishes_at_the_dtype():
    spec("binary", scale=1e-30)
    with pytest.raises(ValueError, match="rounds to 0 in float16"):
        spec("binary", scale=1e-30, dtype="float16")


def test_duplicate_rows_and_min_distance_on_a_constructed_table():
    t = np.array([[0.0, 1.0], [3.0, 4.0], [-0.0, 1.0], [3.0, 4.5]])
    assert duplicate_rows(t) == [(0, 2)]  # -0.0 == 0.0
    dist, pair = min_pairwise_distance(t[[0, 1, 3]], chunk=2)
    assert dist == pytest.approx(0.5) and pair == (1, 2)


def test_random_code_is_seeded_and_standard_normal():
    a, b = spec("random", seed=3), spec("random", seed=4)
    assert np.array_equal(a.codebook(), spec("random", seed=3).codebook())
    assert not np.array_equal(a.codebook(), b.codebook())
    z = a.codebook()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    # the table of a smaller vocabulary is a prefix: same tokens, same codes
    assert np.array_equal(spec("random", vocab_size=1000, seed=3, code_bits=16).codebook(), z[:1000])


def test_sinusoidal_code_definition():
    s = spec("sinusoidal", code_bits=4, base=100.0)
    t = s.codebook()
    assert np.allclose(t[5], [np.sin(5), np.cos(5), np.sin(5 / 10), np.cos(5 / 10)])
    with pytest.raises(ValueError, match="code_width=5 must be even"):
        spec("sinusoidal", code_bits=5)


def test_centered_and_norm_matched_bit_codes():
    c = spec("gf2", centered=True, scale=0.5)
    v = c.vectors(np.arange(10))
    assert set(np.unique(v)) == {-0.5, 0.5}
    assert c.input_rms() == pytest.approx(0.5)
    plain = spec("binary")
    # V = 1.5·2^15: bits 0..13 are 1 for half the tokens, bits 14 and 15 for a third
    assert plain.input_rms() == pytest.approx(np.sqrt((14 * 0.5 + 2 / 3) / 16))


@pytest.mark.parametrize("kind", CODE_KINDS)
def test_fingerprints_separate_maps_and_round_trip(kind):
    base = spec(kind, vocab_size=1000, hidden_size=32)
    d = json.loads(json.dumps(base.to_dict()))
    assert CodeSpec.from_dict(d) == base
    variants = [spec(kind, vocab_size=1000, hidden_size=32, scale=2.0), spec(kind, vocab_size=1001, hidden_size=32)]
    if kind in ("gf2", "random", "lowdim"):
        variants.append(spec(kind, vocab_size=1000, hidden_size=32, seed=1))
    if kind in ("binary", "gf2"):
        variants.append(spec(kind, vocab_size=1000, hidden_size=32, centered=True))
    assert base.fingerprint not in {v.fingerprint for v in variants}
    assert spec(kind, vocab_size=1000, hidden_size=32, dtype="bfloat16").fingerprint == base.fingerprint


def test_options_of_other_families_are_refused():
    with pytest.raises(ValueError, match="code_centered"):
        spec("random", centered=True)
    with pytest.raises(ValueError, match="code_base"):
        spec("binary", base=10.0)
    with pytest.raises(ValueError, match="hidden_size=8"):
        spec("random", hidden_size=8)


@pytest.mark.parametrize("kind", FLOAT_KINDS)
def test_analyze_code_reports_float_codes(kind):
    r = analyze_code(spec(kind, vocab_size=2000, code_bits=16, dtype="bfloat16"))
    assert r["collisions"] == 0 and r["input_rank"] == 16 and r["min_pairwise_distance"] > 0
    assert r["dtype"] == "bfloat16"
