"""Process groups: the one module that talks to megatron's ``parallel_state``.

Everything else receives a ``ProcessGroupCollection`` and a :class:`ParallelLayout`.
"""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.process_groups_config import ProcessGroupCollection

from megatron_fixedcode.compat.cpu import apply_cpu_patches
from megatron_fixedcode.compat.torch_adam import apply_torch_adam_patches
from megatron_fixedcode.compat.layout import ParallelLayout  # noqa: F401  (re-exported)


def runtime_device() -> torch.device:
    """Where the model, batches and every collective's tensors live: this rank's GPU
    (``torch.cuda.current_device()``) when CUDA is used, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def describe_runtime() -> str:
    """One line: which runtime this process uses, and why the CPU one when it is chosen."""
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        return (
            f"runtime: CUDA + NCCL on {torch.cuda.get_device_name(index)} "
            f"({torch.cuda.device_count()} visible; torch {torch.__version__}, CUDA {torch.version.cuda})"
        )
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build"
    else:
        why = (
            f"torch {torch.__version__} has CUDA {torch.version.cuda} but sees no GPU "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!s})"
        )
    return f"runtime: CPU + gloo, megatron-core patched for CPU (compat/cpu.py): {why}"


def initialize_distributed(layout: ParallelLayout, seed: int = 1234, timeout_s: int = 600) -> ProcessGroupCollection:
    """Start torch.distributed from torchrun's environment (NCCL on GPUs, gloo on CPU), build
    megatron's parallel groups and seed its RNG streams. A plain ``python`` run is world size 1.
    ``timeout_s``: every group's collective timeout (the trainer passes --distributed-timeout-minutes)."""
    on_cpu = apply_cpu_patches()
    apply_torch_adam_patches()  # on GPUs too, where neither TE nor apex is installed
    if not dist.is_initialized():
        if not on_cpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # torchrun / srun set these
        dist.init_process_group(
            backend="gloo" if on_cpu else "nccl",
            timeout=datetime.timedelta(seconds=timeout_s),
            # A plain `python` run is a world of one on a free loopback port; the environment
            # (inherited by child processes) is left untouched.
            **({} if launched else {"init_method": f"tcp://127.0.0.1:{free_port()}", "rank": 0, "world_size": 1}),
        )
    layout.data_parallel_size(dist.get_world_size())
    if not _groups_match(layout):
        # Rebuilding would leave the old groups alive (destroy_model_parallel only forgets them): in one
        # process that builds models repeatedly (tests, export) each gloo group keeps threads running.
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tensor_model_parallel_size,
            pipeline_model_parallel_size=layout.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=layout.virtual_pipeline_model_parallel_size,
            context_parallel_size=layout.context_parallel_size,
            distributed_timeout_minutes=max(1, -(-timeout_s // 60)),  # --distributed-timeout-minutes
        )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return ProcessGroupCollection.use_mpu_process_groups()


def collective_timeout(group=None) -> datetime.timedelta | None:
    """The timeout a process group's collectives run under, read back from its backend (None if unknown)."""
    try:
        group = group or dist.distributed_c10d._get_default_group()
        return group._get_backend(runtime_device()).options._timeout
    except (AttributeError, RuntimeError, ValueError):
        return None


def _groups_match(layout: ParallelLayout) -> bool:
    """megatron's groups already exist for this layout (a second initialisation in one process)."""
    return (
        parallel_state.model_parallel_is_initialized()
        and parallel_state.get_tensor_model_parallel_world_size() == layout.tensor_model_parallel_size
        and parallel_state.get_pipeline_model_parallel_world_size() == layout.pipeline_model_parallel_size
        and parallel_state.get_context_parallel_world_size() == layout.context_parallel_size
        and parallel_state.get_virtual_pipeline_model_parallel_world_size()
        == layout.virtual_pipeline_model_parallel_size
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parallel_ranks() -> dict[str, int]:
    """This process's coordinates: tp/pp/cp/dp ranks and sizes, plus first/last pipeline stage."""
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "tp_size": parallel_state.get_tensor_model_parallel_world_size(),
        "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
        "pp_size": parallel_state.get_pipeline_model_parallel_world_size(),
        "cp_rank": parallel_state.get_context_parallel_rank(),
        "dp_rank": parallel_state.get_data_parallel_rank(),
        "dp_size": parallel_state.get_data_parallel_world_size(),
        "is_first_stage": int(parallel_state.is_pipeline_first_stage(ignore_virtual=True)),
        "is_last_stage": int(parallel_state.is_pipeline_last_stage(ignore_virtual=True)),
    }


def destroy_distributed() -> None:
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
