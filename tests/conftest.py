import pytest


@pytest.fixture(scope="session")
def single_rank():
    """megatron parallel state on a world of one (gloo), shared by in-process model tests."""
    from megatron_fixedcode.compat import ParallelLayout, initialize_distributed

    return initialize_distributed(ParallelLayout(), seed=1234)
