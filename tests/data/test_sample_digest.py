"""The per-step sample digest (metrics.jsonl's ``samples``): equal at any data-parallel size, exact, and changed by
a sample moved, replaced or regrouped."""

import torch

from megatron_fixedcode.data.sample_digest import (
    DIGEST_KEY,
    MASK,
    as_hex,
    combine,
    content_hash,
    from_lanes,
    sample_term,
    split_digests,
    to_lanes,
    with_digest,
)
from megatron_fixedcode.data.sampler import fetch_microbatch, num_microbatches, rank_microbatch_indices

GLOBAL_BATCH = 8


class _Stream:
    """Sample i holds tokens derived from ``order[i]``: another order is another dataset order."""

    def __init__(self, order=None):
        self.order = order or {}

    def __getitem__(self, i):
        j = self.order.get(i, i)
        tokens = torch.arange(j, j + 5)
        return {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(5), "position_ids": torch.arange(5)}


def _step_digest(dataset, step: int, dp_size: int, micro_batch_size: int = 2) -> str:
    """Every rank's microbatches of ``step`` with their digests, each rank's sum, then the ranks' lanes summed in
    float64 as the trainer's all-reduce does."""
    lanes = [0.0, 0.0, 0.0]
    for dp_rank in range(dp_size):
        layout = dict(global_batch_size=GLOBAL_BATCH, micro_batch_size=micro_batch_size, dp_size=dp_size)
        batches = []
        for m in range(num_microbatches(GLOBAL_BATCH, micro_batch_size, dp_size)):
            indices = rank_microbatch_indices(step, m, dp_rank=dp_rank, **layout)
            batches.append(with_digest(fetch_microbatch(dataset, indices), indices, GLOBAL_BATCH))
        stripped, mine = split_digests(batches)
        assert all(DIGEST_KEY not in b for b in stripped) and DIGEST_KEY in batches[0]
        lanes = [a + b for a, b in zip(lanes, to_lanes(mine))]
    return as_hex(from_lanes(lanes))


def test_the_same_samples_give_the_same_digest_at_any_data_parallel_size():
    stream = _Stream()
    for step in (0, 3):
        digests = {dp: _step_digest(stream, step, dp) for dp in (1, 2, 4)}
        assert len(set(digests.values())) == 1, digests
    # exact: the direct sum of the step's terms (microbatch: the run of 2 in the global batch; row in it)
    content = [content_hash(fetch_microbatch(stream, [i]), 0) for i in range(GLOBAL_BATCH)]
    expected = combine(sample_term(i // 2, i % 2, i, content[i]) for i in range(GLOBAL_BATCH))
    assert _step_digest(stream, 0, 1) == as_hex(expected)
    assert _step_digest(stream, 0, 2) != _step_digest(stream, 1, 2)  # another step: other samples


def test_a_swapped_pair_a_replaced_sample_or_another_micro_batch_size_changes_it():
    straight = _step_digest(_Stream(), 0, 2)
    assert _step_digest(_Stream({1: 2, 2: 1}), 0, 2) != straight  # samples 1 and 2 trade microbatches
    assert _step_digest(_Stream({0: 1, 1: 0}), 0, 2) != straight  # two rows of one microbatch trade places
    assert _step_digest(_Stream({5: 99}), 0, 2) != straight  # another dataset order: other tokens at index 5
    assert _step_digest(_Stream(), 0, 2, micro_batch_size=4) != straight  # the same samples grouped otherwise


def test_lanes_sum_exactly_modulo_two_to_the_64():
    values = [MASK, MASK - 1, 1 << 63, 12345, (1 << 64) - (1 << 22), 0]
    lanes = [sum(column) for column in zip(*(to_lanes(v) for v in values))]
    assert from_lanes(lanes) == sum(values) % (1 << 64) == combine(values)
    assert as_hex(combine(values)) == f"{sum(values) % (1 << 64):016x}" and len(as_hex(1)) == 16
    # the term is pinned: digests written by older runs stay comparable
    assert (as_hex(sample_term(0, 0, 0, 0)), as_hex(sample_term(1, 2, 3, 4))) == (
        "a141af8a4a120dc5",
        "d2e09b25a4e6a3eb",
    )
