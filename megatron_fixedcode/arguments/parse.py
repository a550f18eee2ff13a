"""Megatron-LM style command line + YAML recipes → validated component configs (a :class:`PretrainConfig`).

The steps of :func:`parse_pretrain_args`, each in its own module: the parser (``core_flags``), the recipe
(``recipe``), the inputs the flags name (read cheaply here), refusals of the flags as given, Megatron-LM's
derivations, refusals of the resolved flags (``refusals``), then the typed configs. Every inconsistency
is refused here, before any process group, model or data exists; nothing here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from megatron_fixedcode.arguments import derivations, refusals
from megatron_fixedcode.arguments.core_flags import build_parser
from megatron_fixedcode.arguments.derivations import train_paths, valid_paths
from megatron_fixedcode.arguments.downstream_flags import DownstreamConfig
from megatron_fixedcode.arguments.inert_flags import inert_in_use
from megatron_fixedcode.arguments.observe_flags import WatchConfig
from megatron_fixedcode.arguments.out_of_scope import SCOPE_NOTE, out_of_scope
from megatron_fixedcode.arguments.recipe import load_recipe
from megatron_fixedcode.arguments.tokenizer_flags import OTHER_TOKENIZERS, TokenizerConfig
from megatron_fixedcode.arguments.checkpoint_flags import CheckpointConfig
from megatron_fixedcode.arguments.health_flags import HealthConfig
from megatron_fixedcode.arguments.logging_flags import LoggingConfig
from megatron_fixedcode.arguments.optimizer_flags import OptimConfig
from megatron_fixedcode.arguments.performance_flags import PerformanceConfig
from megatron_fixedcode.arguments.schedule_flags import ScheduleConfig
from megatron_fixedcode.arguments.user_errors import is_rank0
from megatron_fixedcode.compat.layout import ParallelLayout
from megatron_fixedcode.data.config import DataConfig, SFTFields
from megatron_fixedcode.models.code_matrix_file import CodeMatrixFile, load_code_matrix
from megatron_fixedcode.models.config import ModelConfig
from megatron_fixedcode.tokenizers.base import tokenizer_files


@dataclasses.dataclass(kw_only=True)
class PretrainConfig:
    """Everything one training run needs, each part owned by its component. ``args`` is the parsed command
    line: the model config and the run's record (:meth:`as_dict`) read it; the trainer reads the parts."""

    args: argparse.Namespace
    layout: ParallelLayout
    optim: OptimConfig
    schedule: ScheduleConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig
    data: DataConfig | None  # None: a dry run given no data
    tokenizer: TokenizerConfig
    performance: PerformanceConfig
    health: HealthConfig
    watch: WatchConfig = WatchConfig()
    downstream: DownstreamConfig = DownstreamConfig()
    code_matrix: CodeMatrixFile | None = None  # --code-matrix, read once at parse time
    inert: list[str] = dataclasses.field(default_factory=list)  # Megatron flags set here that have no effect
    dry_run: bool = False  # --dry-run: print the resolved config and the plan (memory_estimate.print_plan), then exit

    def model_config(self, vocab_size: int) -> ModelConfig:
        try:
            return self._model_config(vocab_size)
        except ValueError as e:
            if self.code_matrix is not None and "code_matrix" in str(e):
                raise ValueError(f"--code-matrix {self.code_matrix.path}: {e}") from None
            raise

    def _model_config(self, vocab_size: int) -> ModelConfig:
        a = self.args
        return ModelConfig(
            num_layers=a.num_layers,
            hidden_size=a.hidden_size,
            num_attention_heads=a.num_attention_heads,
            num_query_groups=a.num_query_groups if a.group_query_attention else None,
            ffn_hidden_size=a.ffn_hidden_size,
            seq_length=a.seq_length,
            vocab_size=a.vocab_size or vocab_size,
            block=a.block,
            norm_epsilon=a.layernorm_epsilon,
            hidden_dropout=a.hidden_dropout,
            attention_dropout=a.attention_dropout,
            layernorm_zero_centered_gamma=a.layernorm_zero_centered_gamma,
            # without full recompute Megatron-LM leaves them unused
            recompute_method=a.recompute_method if a.recompute_granularity == "full" else None,
            recompute_num_layers=a.recompute_num_layers if a.recompute_granularity == "full" else None,
            rotary_base=a.rotary_base,
            init_method_std=a.init_method_std,
            kv_channels=None if a.kv_channels == a.hidden_size // a.num_attention_heads else a.kv_channels,
            rotary_percent=a.rotary_percent,
            rotary_interleaved=a.rotary_interleaved,
            add_bias_linear=a.add_bias_linear,
            position_embedding_type=a.position_embedding_type,
            max_position_embeddings=a.max_position_embeddings,
            share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights,
            add_qkv_bias=a.add_qkv_bias,
            qk_layernorm=a.qk_layernorm,
            squared_relu=a.squared_relu,
            rope_scaling=a.use_rope_scaling,
            rope_scaling_factor=a.rope_scaling_factor,
            make_vocab_size_divisible_by=a.make_vocab_size_divisible_by,
            padded_vocab=a.padded_vocab_size,
            input_embedding=a.input_embedding,
            code_seed=a.code_seed,
            code_matrix=self.code_matrix and self.code_matrix.matrix,
            code_offset=a.code_offset,
            code_impl=a.code_impl,
            code_kernel=a.code_kernel,
            code_scale=a.code_scale,
            code_bits=a.code_bits,
            code_min_weight=a.code_min_weight,
            code_width=a.code_width,
            code_centered=a.code_centered,
            code_norm_match=a.code_norm_match,
            code_base=a.code_base,
            # Megatron-LM's default left alone: TE where it can run, else local layers (logged at startup)
            transformer_impl="auto"
            if a.transformer_impl == "transformer_engine" and not a.transformer_impl_given
            else a.transformer_impl,
            bf16=a.bf16,
            autocast_bf16=a.precision == "fp32-autocast-bf16",
            recompute_granularity=a.recompute_granularity,
            fp8=a.fp8,
            fp8_recipe=a.fp8_recipe,
            fp8_amax_history_len=a.fp8_amax_history_len,
            fp8_amax_compute_algo=a.fp8_amax_compute_algo,
            fp8_param=a.fp8_param_gather,
        )

    def as_dict(self) -> dict[str, Any]:
        """The resolved flags, as a checkpoint records them (with the tokenizer in force: maybe the checkpoint's)."""
        flags = {k: v for k, v in vars(self.args).items() if k not in ("config", "dry_run", "transformer_impl_given")}
        return {**flags, **dataclasses.asdict(self.tokenizer)}


def data_config(a: argparse.Namespace) -> DataConfig:
    """The data the run reads, as the dataset builders take it."""
    return DataConfig(
        data_path=train_paths(a),
        valid_data_path=valid_paths(a),
        dataset_type=a.dataset_type,
        seq_length=a.seq_length,
        split=a.split or "969, 30, 1",
        cache_path=a.data_cache_path,
        samples_per_shard_visit=a.samples_per_shard_visit,
        mmap_bin_files=a.mmap_bin_files,
        sft_fields=SFTFields(prompt=a.sft_prompt_key, response=a.sft_response_key, messages=a.sft_messages_key),
        mock=a.mock_data,
        num_workers=a.num_workers,
    )


def _read_code_matrix(a: argparse.Namespace) -> CodeMatrixFile | None:
    """Load --code-matrix once; its offset (if any) becomes --code-offset. Reported on rank 0."""
    if a.code_matrix is None:
        return None
    loaded = load_code_matrix(a.code_matrix)
    if loaded.offset is not None:
        if a.code_offset not in (0, loaded.offset):
            raise ValueError(
                f"--code-matrix {a.code_matrix} gives offset {loaded.offset}, --code-offset "
                f"{a.code_offset}: give one of them"
            )
        a.code_offset = loaded.offset
    if is_rank0():
        print("\n".join(loaded.report()), file=sys.stderr)
    return loaded


def _check_inputs(a: argparse.Namespace) -> None:
    """What the flags name and can be read cheaply, refused at parse time (the dry run included):
    blend weights (megatron asserts them on every rank), damaged or empty shards (their index
    only) and a damaged tokenizer file."""
    from megatron_fixedcode.data.config import parse_blend

    from megatron_fixedcode.data.validate import check_shards

    source = f"--data-args-path {a.data_args_path}" if a.data_args_path else "--data-path"
    train_flag = source if a.data_path or a.data_args_path else "--train-data-path"
    train_field = "data_path" if a.data_path or a.data_args_path else "train_data_path"
    for flag, field, paths in (
        (train_flag, train_field, train_paths(a)),
        ("--valid-data-path", "valid_data_path", valid_paths(a)),
    ):
        if paths:
            prefixes, _ = parse_blend(paths, flag)
            if a.dataset_type != "sft":  # index reads only; a missing shard is named where datasets are built
                check_shards([p for p in prefixes if os.path.isfile(p + ".idx")], None, field)
    derivations.resolve_tokenizer_type(a)
    if a.tokenizer_type in OTHER_TOKENIZERS:
        return  # refused by refusals.refuse_given, naming what it is
    files = [f for f in tokenizer_files(a) if f]
    if files and (not a.dry_run or all(Path(f).exists() for f in files)):  # a login node may lack them
        from megatron_fixedcode.tokenizers import tokenizer_from_args

        tokenizer_from_args(a)


# A recipe's keys that name its data (and how it is read): --mock-data on the command line replaces them.
RECIPE_DATA_KEYS = (
    "data_path",
    "train_data_path",
    "valid_data_path",
    "test_data_path",
    "data_args_path",
    "per_split_data_args_path",
    "data_manifest",
    "data_manifest_weights",
    "dataset_type",
)


def _drop_recipe_data(recipe: dict[str, Any], path: str) -> None:
    """Remove the recipe's data keys (one line on rank 0 names them); the same keys given on the command
    line with --mock-data are still refused (refusals: a data source of its own)."""
    dropped = [k for k in RECIPE_DATA_KEYS if recipe.get(k) not in (None, [], "gpt")]
    for key in dropped:
        del recipe[key]
    if dropped and is_rank0():
        print(f"note: --mock-data: the recipe's {', '.join(dropped)} are ignored (--config {path})", file=sys.stderr)


def _refuse_out_of_scope(argv: list[str], parser: argparse.ArgumentParser) -> None:
    known = set(parser._option_string_actions)
    for token in argv:
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and flag not in known and (what := out_of_scope(flag)):
            parser.error(f"{flag}: {what}: {SCOPE_NOTE}")


def parse_pretrain_args(argv: list[str] | None = None) -> PretrainConfig:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _refuse_out_of_scope(argv, parser)
    pre, _ = parser.parse_known_args(argv)
    if pre.config:
        recipe = load_recipe(pre.config, parser)
        if pre.mock_data:  # --mock-data on the command line: the recipe's data keys give way to it
            _drop_recipe_data(recipe, pre.config)
        parser.set_defaults(**recipe)
    a = parser.parse_args(argv)
    inert = inert_in_use(a, parser)  # as given: the values derived below are not the user's
    try:
        from megatron_fixedcode.data.manifest import resolve_data_sources

        recipe_data = {k: parser.get_default(k) for k in ("data_path", "train_data_path", "valid_data_path")}
        resolve_data_sources(a, recipe_data)  # --data-args-path / --data-manifest -> data paths (docs/data.md)
        _check_inputs(a)
    except ValueError as e:
        parser.error(str(e))
    refusals.refuse_given(a, parser)
    derivations.derive(a)
    refusals.refuse(a, parser)
    try:
        layout = ParallelLayout(
            tensor_model_parallel_size=a.tensor_model_parallel_size,
            pipeline_model_parallel_size=a.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=a.virtual_pipeline_model_parallel_size,
            context_parallel_size=a.context_parallel_size,
            sequence_parallel=a.sequence_parallel,
        )
        cfg = PretrainConfig(
            args=a,
            layout=layout,
            optim=OptimConfig.from_args(a),
            schedule=ScheduleConfig.from_args(a),
            checkpoint=CheckpointConfig.from_args(a),
            logging=LoggingConfig.from_args(a),
            data=data_config(a) if train_paths(a) or a.mock_data else None,
            tokenizer=TokenizerConfig.from_args(a),
            performance=PerformanceConfig.from_args(a),
            health=HealthConfig.from_args(a),
            watch=WatchConfig.from_args(a),
            downstream=DownstreamConfig.from_args(a),
            code_matrix=_read_code_matrix(a),
            dry_run=a.dry_run,
        )
        if a.vocab_size or a.dry_run:
            cfg.model_config(a.vocab_size or 2**16)  # validates model fields and the code early
    except ValueError as e:
        parser.error(str(e))
    cfg.inert = inert
    return cfg
