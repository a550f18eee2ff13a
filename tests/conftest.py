import pytest


@pytest.fixture(scope="session")
def single_rank():
    """megatron parallel state on a world of one (gloo), shared by in-process model tests."""
    from megatron_fixedcode.compat import ParallelLayout, initialize_distributed

    return initialize_distributed(ParallelLayout(), seed=1234)


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests skip on machines without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
