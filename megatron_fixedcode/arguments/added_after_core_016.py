"""Flags Megatron-LM added after core_v0.16.1 (``tools/dev/megatron_reference.py --added-since``: its
parser at core_v0.19.0 against core_v0.16.1's), but for those :data:`out_of_scope.OUT_OF_SCOPE` names by family.
This parser follows core_v0.16.1: each is refused in one line saying so. The training flags both
versions share keep their names, dests and defaults (docs/training.md notes the few 0.19 differences).
"""

from __future__ import annotations

ADDED_AFTER_0_16 = frozenset(
    "--" + name
    for name in """
    activation-offload-fraction async-ckpt-cpu-priority async-ckpt-io-priority async-ckpt-use-cpu-shm
    async-strategy chat-template ckpt-fully-parallel-load-exchange-algo ckpt-fully-parallel-load-process-group
    ckpt-fully-parallel-save-process-group cpu-offloading-retain-pinned-cpu-buffers
    dataloader-inter-document-masking ddp-param-name-patterns-for-fp32-local-accumulation
    delay-offload-until-cuda-graph delta-offload-bytes-across-pp-ranks disable-align-grad-reduce
    disable-ckpt-load-validate-sharding-integrity disable-dsa-indexer-rotate-activation
    disable-dsa-indexer-scoring-relu disable-flight-recorder-dump-on-timeout
    disable-flight-recorder-extra-dump-on-exec disable-flight-recorder-include-only-active
    disable-pad-vocab-size disable-stream-ckpt-dequant disable-tokenizer-sentencepiece-ignore-extra-whitespaces
    dist-ckpt-workers enable-msc eval-global-batch-size eval-micro-batch-size exit-signal-handler-for-training
    expert-tensor-parallel-num-weight-shards fault-injector-delay-start-iteration fault-injector-fault-delay
    fault-injector-fault-probabilities fault-injector-fault-types fault-injector-mtti-seconds
    fault-injector-num-ranks fault-injector-offset-seconds fault-injector-ranks fault-injector-seed
    fine-grained-offloading-max-inflight-offloads flash-attention-version flight-recorder-dump-path
    flight-recorder-include-stack-trace flight-recorder-trace-buffer-size fp8-output-proj freeze-all-layers
    fused-residual-rmsnorm gpu-sniff-test-interval high-priority-a2a-comm-stream lion-beta1 lion-beta2
    logits-load-decode-threads logits-load-dir logits-load-ignore-errors logits-load-kd-loss-alpha
    logits-load-msc-prefetch-depth logits-load-prefetch-factor logits-save-dir logits-save-dtype
    logits-save-top-k logits-save-top-p logits-save-top-p-min-k megatron-fsdp-enable-fine-grained-param-gather
    megatron-fsdp-grad-comm-dtype megatron-fsdp-main-grads-dtype megatron-fsdp-main-params-dtype
    megatron-fsdp-max-pool-double-buffer mla-down-proj-fusion mlp-chunks-for-training mup-attn-scale-power
    mup-base-head-dim mup-base-hidden-size mup-embedding-mult mup-output-mult mup-width-mult
    no-ckpt-load-validate-sharding-integrity no-dsa-indexer-rotate-activation no-dsa-indexer-scoring-relu
    no-flight-recorder-dump-on-timeout no-flight-recorder-extra-dump-on-exec
    no-flight-recorder-include-only-active no-pad-vocab-size no-stream-ckpt-dequant
    no-tokenizer-sentencepiece-ignore-extra-whitespaces no-use-layer-wise-param-layout
    no-yarn-correction-range-round-to-int null-tokenizer-eod-id null-tokenizer-pad-id num-speculative-tokens
    nvtx-ranges optimizer-cuda-graph overlap-dispatch-backward-with-experts-wgrad override-ckpt-iteration
    pytorch-profiler-collect-callstack pytorch-profiler-collect-chakra pytorch-profiler-collect-shapes
    record-shapes save-activations-interval save-params-interval save-tokens-per-expert-interval
    start-eval-at-iter step-batch-size-schedule tensor-parallel-num-weight-shards
    tokenizer-hf-no-include-special-tokens tokenizer-hf-no-use-fast use-grouped-gemm-for-dense-mlp
    use-grouped-gemm-for-shared-expert use-mup use-same-sampling-seed-across-dp-ranks
    use-transformer-engine-op-fuser validation-set-names verify-integrity yarn-beta-fast yarn-beta-slow
    yarn-correction-range-round-to-int yarn-original-max-position-embeddings
""".split()
)
