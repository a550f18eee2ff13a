"""The CPU runtime layer's allocator setting, measured in fresh processes."""

import json
import subprocess
import sys

import pytest
import torch

_FAULTS_PER_64MIB_STEP = """
import json, resource, sys, torch
import megatron_fixedcode.compat.distributed  # noqa: F401  the trainer's process: megatron-core imported
from megatron_fixedcode.compat.cpu import keep_freed_memory_for_reuse
applied = keep_freed_memory_for_reuse() if sys.argv[1] == "reuse" else False
def step():  # what an activation does each step: allocate, write, free
    torch.empty(16 << 20).fill_(1.0)
step(); step()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": min(faults)}))
"""


def _faults(mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS_PER_64MIB_STEP, mode], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_freed_activation_memory_is_reused_without_page_faults():
    # Fewest faults of 6 cycles: the kernel may reclaim idle free memory now and then (DAMON).
    default, reuse = _faults("default"), _faults("reuse")
    assert reuse["applied"]
    assert default["faults"] > 10_000  # glibc unmaps the 64 MiB block and faults 16,384 pages back in
    assert reuse["faults"] < 100


# --- megatron-core patches (apply_cpu_patches), checked where they run: on CPU tensors ---------------


def _mcore_version():
    import megatron.core
    from packaging.version import Version

    return Version(megatron.core.__version__)


def _needs_mcore_019():
    from packaging.version import Version

    if _mcore_version() < Version("0.19"):
        pytest.skip(f"megatron-core {_mcore_version()}: the patch is for 0.19.x (Python 3.12 environments)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU patches only")
def test_grad_sync_of_megatron_ddp_runs_on_cpu(single_rank):
    """finalize_model_grads -> finish_grad_sync -> start_grad_sync (0.19: waits on the current CUDA stream)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_fixedcode.compat import cpu_transformer_config_overrides

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, **cpu_transformer_config_overrides())
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 4, bias=False)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), module=linear, pg_collection=single_rank)
    x = torch.randn(3, 8)
    ddp(x).sum().backward()
    ddp.finish_grad_sync()
    expected = torch.ones(3, 4).T @ x  # d(sum(x W^T))/dW on a world of one
    torch.testing.assert_close(linear.weight.main_grad, expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU patches only")
def test_grad_buffer_stream_is_a_no_op_on_cpu(single_rank):
    _needs_mcore_019()
    from megatron.core.distributed import param_and_grad_buffer

    stream = param_and_grad_buffer.torch.cuda.current_stream()
    stream.wait_event(object())
    stream.wait_stream(stream)
    assert param_and_grad_buffer.torch.zeros(1, device="cuda").device.type == "cpu"


@pytest.mark.slow
def test_kernel_load_survives_a_lock_left_by_a_killed_process(tmp_path, monkeypatch):
    """torch's extension loader waits forever on a build-directory ``lock`` file that a process
    killed mid-load left behind; our loader takes that lock over (it would hang on old code). The
    build is this environment's, copied (a fresh compile would cost a minute and test nothing more)."""
    import shutil
    import subprocess
    import sys

    import torch

    from megatron_fixedcode.kernels import _build_directory_guard, fixed_code_cpu_kernel
    from tests.helpers import REPO

    if fixed_code_cpu_kernel() is None:
        pytest.skip("the kernel cannot be built here")
    name = "megatron_fixedcode_fixed_code_cpu_" + (
        "avx2" if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "generic"
    )
    built = _build_directory_guard(name).directory
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    copy = _build_directory_guard(name).directory
    shutil.copytree(built, copy)
    (copy / "lock").write_text("")
    probe = (
        "from megatron_fixedcode.kernels import fixed_code_cpu_kernel; from pathlib import Path;"
        f"print(fixed_code_cpu_kernel() is not None, Path({str(copy / 'lock')!r}).exists())"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "False"], proc.stdout + proc.stderr[-2000:]


def test_a_second_initialisation_reuses_the_groups(single_rank):
    """Rebuilding megatron's groups in one process leaks every old gloo group and its threads."""
    from megatron.core import parallel_state

    from megatron_fixedcode.compat import ParallelLayout, initialize_distributed

    before = parallel_state.get_data_parallel_group()
    initialize_distributed(ParallelLayout(), seed=7)
    assert parallel_state.get_data_parallel_group() is before


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU patches apply only without CUDA")
def test_cuda_acting_tensors_are_scoped_to_the_patched_methods():
    """Megatron's optimizer constructors see CUDA type names while they run; nothing else does."""
    from megatron_fixedcode.compat import cpu

    cpu.apply_cpu_patches()
    t = torch.zeros(2)
    assert t.type() == "torch.FloatTensor" and t.cuda is not None
    seen = []

    @cpu._under_tensors_act_as_cuda
    def inside(x):
        seen.append((x.type(), x.to(torch.bfloat16).type(), x.cuda() is x, x.type(torch.float64).dtype))

    inside(t)
    assert seen == [("torch.cuda.FloatTensor", "torch.cuda.BFloat16Tensor", True, torch.float64)]
    assert t.type() == "torch.FloatTensor"  # restored
    with pytest.raises((AssertionError, RuntimeError)):
        t.cuda()  # a CPU-only torch: the real .cuda() is back
    import megatron.core.optimizer.distrib_optimizer as distrib

    for module, cls, method in cpu._METHODS_ASSUMING_CUDA_TENSORS:  # each one is wrapped
        owner = getattr(__import__(module, fromlist=[cls]), cls)
        assert getattr(owner, method).__wrapped__ is not None
    assert distrib.DistributedOptimizer.__init__.__wrapped__


def test_torch_adam_patches_apply_without_te_or_apex():
    from megatron.core.optimizer import distrib_optimizer

    from megatron_fixedcode.compat.torch_adam import _STATE_LOADERS, apply_torch_adam_patches

    applied = apply_torch_adam_patches()
    assert applied is (not distrib_optimizer.HAVE_APEX_OR_TE)
    if applied:
        cls = distrib_optimizer.DistributedOptimizer
        assert hasattr(cls.state_dict, "__wrapped__")
        assert all(hasattr(getattr(cls, n), "__wrapped__") for n in _STATE_LOADERS if hasattr(cls, n))


_CHECKPOINTING_IMPORT = """
import importlib.metadata as md, json, sys
import megatron_fixedcode  # noqa: F401  settles the resiliency package's release first (compat/nvrx_release.py)
from megatron_fixedcode.checkpoint import CorruptCheckpoint  # noqa: F401  what failed on megatron-core 0.19
import megatron.core.dist_checkpointing.strategies.torch as strategies
try:
    nvrx = md.version("nvidia-resiliency-ext")
except md.PackageNotFoundError:
    nvrx = None
print(json.dumps({"nvrx": nvrx, "core": md.version("megatron-core"), "have_nvrx": getattr(strategies, "HAVE_NVRX", None),
                  "patched": "megatron.core.dist_checkpointing.strategies.nvrx" in sys.modules}))
"""


def test_checkpointing_imports_beside_the_installed_resiliency_release():
    """megatron-core 0.19 asserted nvidia-resiliency-ext >= 0.6 at import, through a ``__version__`` that 0.4.1
    (the release served) lacks: with the [ft] extra installed nothing trained on Python 3.12. Both legs install
    it (scripts/setup_env.sh); on 0.19 megatron-core then uses its own asynchronous save."""
    from megatron_fixedcode.compat.nvrx_release import _release

    out = subprocess.run([sys.executable, "-c", _CHECKPOINTING_IMPORT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["nvrx"] is not None, "the test environments install the [ft] extra (scripts/setup_env.sh)"
    if _release(seen["core"]) >= (0, 19) and _release(seen["nvrx"]) < (0, 6):
        assert seen["patched"] and seen["have_nvrx"] is False
