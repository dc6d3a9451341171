"""What DeepSpeed 0.19.8 reads from its config, as plain data (the core must not import deepspeed).

Derived once from the installed DeepSpeed 0.19.8 and checked against it by
``tests/rules/test_deepspeed_config.py::test_data_matches_installed_deepspeed``:

- ``TOP_LEVEL_KEYS``: every top-level key ``DeepSpeedConfig`` (``deepspeed/runtime/config.py`` and its
  sub-config getters) or ``deepspeed.initialize`` looks up. Any other top-level key is ignored silently.
- ``STRICT_SECTIONS``: sections parsed by a pydantic ``DeepSpeedConfigModel`` (``extra="forbid"``, so an
  unknown key is a ValidationError), with every accepted name (field names and their ``alias``,
  ``populate_by_name=True`` accepts both), the integer fields, and deprecated fields with their
  replacement. Nested sections are dotted (``zero_optimization.offload_param``).
- ``REMOVED_TOP_LEVEL`` / ``REMOVED_ZERO_KEYS``: keys DeepSpeed 0.19.8 refuses with ``DeepSpeedConfigError``
  (``_reject_removed_config_keys``, DeepSpeed issue #8489).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Tuple

DATA_VERSION = "0.19.8"


@dataclass(frozen=True)
class Section:
    """The keys of one strictly validated DeepSpeed config section.

    Attributes:
        keys: every name the section accepts (field names and aliases).
        int_fields: names whose type is ``int`` (a fractional float is refused since DeepSpeed 0.15.0).
        canonical: alias -> field name (``stage3_prefetch_bucket_size`` -> ``prefetch_bucket_size``).
        deprecated: deprecated field -> what replaces it (DeepSpeed logs a warning and maps it).
    """

    keys: FrozenSet[str]
    int_fields: FrozenSet[str] = frozenset()
    canonical: Dict[str, str] = field(default_factory=dict)
    deprecated: Dict[str, str] = field(default_factory=dict)


TOP_LEVEL_KEYS: FrozenSet[str] = frozenset({
    "activation_checkpointing", "aio", "amp", "autotuning", "bf16", "bfloat16", "checkpoint", "comet",
    "comms_logger", "communication_data_type", "compile", "compression_training", "csv_monitor",
    "curriculum_learning", "data_efficiency", "data_parallel_size", "data_types", "dataloader_drop_last",
    "datastates_ckpt", "disable_allgather", "disable_python_gc", "dump_state", "eigenvalue", "elasticity",
    "expert_parallel", "flops_profiler", "fp16", "gradient_accumulation_steps", "gradient_allreduce_op",
    "gradient_clipping", "gradient_predivide_factor", "graph_harvesting", "hybrid_engine", "log_level",
    "managed_gradient_accumulation", "memory_breakdown", "nebula", "optimizer", "pipeline", "prescale_gradients",
    "progressive_layer_drop", "quantize_training", "scheduler", "seq_parallel_communication_data_type",
    "sequence_parallel_size", "sparse_attention", "sparse_gradients", "steps_per_print", "tensor_parallel",
    "tensorboard", "timers", "torch_autocast", "train_batch_size", "train_micro_batch_size_per_gpu",
    "use_data_before_expert_parallelism", "vocabulary_size", "wall_clock_breakdown", "wandb", "weight_quantization",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "zero_optimization",
})

STRICT_SECTIONS: Dict[str, Section] = {
    'zero_optimization.offload_param': Section(
        keys=frozenset({"buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"}),
        int_fields=frozenset({"buffer_count", "buffer_size", "max_in_cpu"}),
        canonical={},
        deprecated={}),
    'zero_optimization.offload_optimizer': Section(
        keys=frozenset({"buffer_count", "cpuadam_cores_perc", "device", "fast_init", "nvme_path", "pin_memory",
            "pipeline_read", "pipeline_write", "ratio", "super_offload"}),
        int_fields=frozenset({"buffer_count"}),
        canonical={},
        deprecated={}),
    'zero_optimization.zenflow': Section(
        keys=frozenset({"auto_ratio", "full_warm_up_rounds", "offload", "overlap_step", "pt_reserved_cores_perc",
            "select_interval", "select_strategy", "steps_per_epoch", "topk_ratio", "update_interval"}),
        int_fields=frozenset({"full_warm_up_rounds", "steps_per_epoch"}),
        canonical={},
        deprecated={}),
    'zero_optimization.leaf_module': Section(
        keys=frozenset({"classes", "name_suffixes", "names"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
    'zero_optimization': Section(
        keys=frozenset({"allgather_bucket_size", "allgather_partitions", "allgather_sequential",
            "compute_grad_norm", "contiguous_gradients", "cpu_offload", "cpu_offload_param",
            "cpu_offload_use_pin_memory", "elastic_checkpoint", "enable_sanity_checks",
            "gather_16bit_weights_on_model_save", "ignore_unused_parameters", "leaf_module", "legacy_stage1",
            "load_from_fp32_weights", "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance",
            "memory_efficient_linear", "model_persistence_threshold", "module_granularity_threshold",
            "offload_optimizer", "offload_param", "overlap_comm", "override_module_apply",
            "param_persistence_threshold", "parameter_alignment", "pipeline_loading_checkpoint",
            "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter", "round_robin_gradients",
            "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
            "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
            "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
            "stage3_module_granularity_threshold", "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params", "sub_group_size",
            "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
            "zero_hpz_partition_size", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
            "zero_quantized_weights"}),
        int_fields=frozenset({"allgather_bucket_size", "max_live_parameters", "max_reuse_distance",
            "model_persistence_threshold", "module_granularity_threshold", "param_persistence_threshold",
            "prefetch_bucket_size", "reduce_bucket_size", "stage", "stage3_max_live_parameters",
            "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
            "stage3_module_granularity_threshold", "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size", "sub_group_size", "zero_hpz_partition_size"}),
        canonical={
            'stage3_allgather_sequential': 'allgather_sequential',
            'stage3_gather_16bit_weights_on_model_save': 'gather_16bit_weights_on_model_save',
            'stage3_max_live_parameters': 'max_live_parameters',
            'stage3_max_reuse_distance': 'max_reuse_distance',
            'stage3_model_persistence_threshold': 'model_persistence_threshold',
            'stage3_module_granularity_threshold': 'module_granularity_threshold',
            'stage3_param_persistence_threshold': 'param_persistence_threshold',
            'stage3_prefetch_bucket_size': 'prefetch_bucket_size',
            'stage3_use_all_reduce_for_fetch_params': 'use_all_reduce_for_fetch_params',
        },
        deprecated={
            'cpu_offload_param': 'offload_param',
            'cpu_offload_use_pin_memory': 'offload_param or offload_optimizer',
            'cpu_offload': 'offload_optimizer',
            'stage3_gather_fp16_weights_on_model_save': 'gather_16bit_weights_on_model_save',
        }),
    'fp16': Section(
        keys=frozenset({"auto_cast", "consecutive_hysteresis", "enabled", "fp16_master_weights_and_grads",
            "hysteresis", "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale"}),
        int_fields=frozenset({"hysteresis", "initial_scale_power", "loss_scale_window", "min_loss_scale"}),
        canonical={},
        deprecated={}),
    'bf16': Section(
        keys=frozenset({"bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow", "enabled",
            "immediate_grad_update"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
    'tensorboard': Section(
        keys=frozenset({"enabled", "job_name", "output_path"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
    'wandb': Section(
        keys=frozenset({"enabled", "group", "project", "team"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
    'csv_monitor': Section(
        keys=frozenset({"enabled", "job_name", "output_path"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
    'comet': Section(
        keys=frozenset({"api_key", "enabled", "experiment_key", "experiment_name", "mode", "online", "project",
            "samples_log_interval", "workspace"}),
        int_fields=frozenset({"samples_log_interval"}),
        canonical={},
        deprecated={}),
    'comms_logger': Section(
        keys=frozenset({"debug", "enabled", "prof_all", "prof_ops", "verbose"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
    'compile': Section(
        keys=frozenset({"autoep_non_moe", "debug_log", "deepcompile", "double_buffer", "free_activation",
            "free_activation_threshold", "keep_all_input_tensors", "keep_int_input_tensors", "offload_activation",
            "offload_activation_pin_memory", "offload_opt_states", "offload_parameters", "passes",
            "symmetric_memory", "sync_after_allgather", "sync_after_reduce", "sync_before_allgather",
            "sync_before_reduce"}),
        int_fields=frozenset({"free_activation_threshold"}),
        canonical={},
        deprecated={}),
    'hybrid_engine': Section(
        keys=frozenset({"enable_cuda_graph", "enabled", "inference_tp_size", "max_out_tokens", "pin_parameters",
            "release_inference_cache", "tp_gather_partition_size"}),
        int_fields=frozenset({"inference_tp_size", "max_out_tokens", "tp_gather_partition_size"}),
        canonical={},
        deprecated={}),
    'tensor_parallel.tensor_parallel': Section(
        keys=frozenset({"mpu", "tp_grain_size", "tp_group", "tp_size"}),
        int_fields=frozenset({"tp_grain_size", "tp_size"}),
        canonical={},
        deprecated={}),
    'tensor_parallel': Section(
        keys=frozenset({"autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host", "kernel_inject",
            "partition_config", "preset_model", "replace_with_kernel_inject", "tensor_parallel", "tp",
            "tp_overlap_comm", "vocab_parallel_ce_backend", "vocab_parallel_lm_head"}),
        int_fields=frozenset({"autotp_size"}),
        canonical={'kernel_inject': 'replace_with_kernel_inject', 'tp': 'tensor_parallel'},
        deprecated={}),
    'weight_quantization': Section(
        keys=frozenset({"enabled", "num_bits", "post_init_quant", "q_groups", "q_type", "quantized_initialization"}),
        int_fields=frozenset({"num_bits", "q_groups"}),
        canonical={},
        deprecated={}),
    'timers.throughput': Section(
        keys=frozenset({"enabled", "synchronized"}),
        int_fields=frozenset({}),
        canonical={},
        deprecated={}),
}

# ``tensor_parallel.tp`` is an alias of the nested ``tensor_parallel.tensor_parallel`` model.
STRICT_SECTIONS["tensor_parallel.tp"] = STRICT_SECTIONS["tensor_parallel.tensor_parallel"]

# Sections strict only since a given DeepSpeed version (the others: since pydantic configs, 0.7.0).
# ``compile``: the 0.14.4 and 0.16.0 sdists read no compile section at all (ignored); 0.17.0 has the strict
# deepcompile ``CompileConfig``.
STRICT_SINCE: Dict[str, str] = {"fp16": "0.17.1", "bf16": "0.17.1", "compile": "0.17.0"}

# Keys people write that DeepSpeed never had, with what they meant (seed guide 001, FACTS A).
NOT_DEEPSPEED_KEYS: Dict[str, str] = {
    "stage3_offload_optimizer": '"offload_optimizer": {"device": "cpu", "pin_memory": true}',
    "stage3_offload_param": '"offload_param": {"device": "cpu", "pin_memory": true}',
    "offload_optimizer_device": '"offload_optimizer": {"device": "cpu"}',
    "offload_param_device": '"offload_param": {"device": "cpu"}',
}

# key -> (why, first DeepSpeed version that refuses it). 0.19.7 and 0.19.8 read from their sdists'
# ``deepspeed/runtime/config.py`` (``_REMOVED_TOP_LEVEL_CONFIG_KEYS``, ``_REMOVED_ZERO_CONFIG_KEYS``); 0.19.6 has none.
REMOVED_TOP_LEVEL: Dict[str, Tuple[str, str]] = {
    "nebula": ("Nebula checkpointing was removed", "0.19.7"),
    "compression_training": ("the compression library was removed", "0.19.7"),
    "quantize_training": ("MoQ / quantize_training was removed", "0.19.7"),
    "sparse_attention": ("Sparse Attention was removed", "0.19.7"),
    "amp": ("the NVIDIA Apex AMP integration was removed (use fp16, bf16 or torch_autocast)", "0.19.8"),
    "sparse_gradients": ("sparse embedding-gradient compression was removed", "0.19.8"),
    "eigenvalue": ("the eigenvalue (MoQ) block was removed", "0.19.8"),
    "elasticity": ("elastic training was removed (set the batch sizes directly)", "0.19.8"),
    "graph_harvesting": ("graph harvesting was removed", "0.19.8"),
    "curriculum_learning": ("top-level curriculum_learning was removed (use data_efficiency.data_sampling)",
                            "0.19.8"),
    "progressive_layer_drop": ("Progressive Layer Dropping was removed", "0.19.8"),
}
REMOVED_ZERO_KEYS: Dict[str, Tuple[str, str]] = {
    "mics_shard_size": ("MiCS sharding was removed", "0.19.7"),
    "mics_hierarchical_params_gather": ("MiCS sharding was removed", "0.19.7"),
    "zeropp_loco_param": ("LoCo-ZeRO++ was removed", "0.19.8"),
}
