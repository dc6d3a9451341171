"""DS rules: fixture tests (fires / stays quiet) and witnesses on the installed DeepSpeed."""

import json
import os
import typing
from pathlib import Path

import pytest

from tests.conftest import codes, run_check

DS_NEW = "deepspeed=0.19.8"
ROOT = Path(__file__).resolve().parents[2]


def _cfg(**extra):
    cfg = {"train_micro_batch_size_per_gpu": 1}
    cfg.update(extra)
    return cfg


def _ds_config(cfg):
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(cfg)


def engine_probe_main(stage: int) -> dict:
    """Build a real one-process ZeRO engine on CPU (gloo) and report what DS009/VR001 claim about it.

    Run only in a fresh process (see the ``engine_probe`` fixture), so that torch.distributed state never
    leaks into the test process.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "offload_param": {"device": "cpu"},
                              "stage3_param_persistence_threshold": 0},
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    out = {
        "stage": engine.zero_optimization_stage(),
        "optimizer": type(engine.optimizer).__name__,
        "params_partitioned": any(hasattr(p, "ds_id") for p in model.parameters()),
        "param_offload_in_optimizer": bool(getattr(engine.optimizer, "offload_param", False)),
    }
    try:
        with engine.no_sync():
            pass
        out["no_sync"] = "ok"
    except AssertionError as exc:
        out["no_sync"] = str(exc)
    # The batch identity at a data-parallel world size > 1: DeepSpeedConfig takes it from the mpu's
    # get_data_parallel_world_size() once torch.distributed is up (the Megatron-style interface).
    from types import SimpleNamespace

    from deepspeed.runtime.config import DeepSpeedConfig

    for world in (2, 4):
        mpu = SimpleNamespace(get_data_parallel_world_size=lambda w=world: w)
        try:
            DeepSpeedConfig(dict(BATCH), mpu=mpu)
            out[f"batch_world_{world}"] = "ok"
        except AssertionError as exc:
            out[f"batch_world_{world}"] = str(exc)
    return out


# ---- the shipped key data matches the installed DeepSpeed -------------------------------------------------

def _derive_sections():
    from pydantic import BaseModel

    from deepspeed.comm.config import CommsLoggerConfig
    from deepspeed.compile.config import CompileConfig
    from deepspeed.inference.config import WeightQuantConfig
    from deepspeed.monitor.config import CometConfig, CSVConfig, TensorBoardConfig, WandbConfig
    from deepspeed.runtime.config import HybridEngineConfig
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.utils.config import DeepSpeedThroughputTimerConfig

    roots = {"zero_optimization": DeepSpeedZeroConfig, "fp16": DeepSpeedFP16Config, "bf16": DeepSpeedBF16Config,
             "tensorboard": TensorBoardConfig, "wandb": WandbConfig, "csv_monitor": CSVConfig, "comet": CometConfig,
             "comms_logger": CommsLoggerConfig, "compile": CompileConfig, "hybrid_engine": HybridEngineConfig,
             "tensor_parallel": TPTrainingConfig, "weight_quantization": WeightQuantConfig,
             "timers.throughput": DeepSpeedThroughputTimerConfig}

    def inner(ann):
        if typing.get_origin(ann) is typing.Union:
            non = [a for a in typing.get_args(ann) if a is not type(None)]
            return inner(non[0]) if len(non) == 1 else None
        return ann

    def dump(cls, prefix, out):
        keys, ints, deprecated = {}, set(), {}
        for name, f in cls.model_fields.items():
            names = [name] + ([f.alias] if f.alias and f.alias != name else [])
            keys.update({n: name for n in names})
            ann = inner(f.annotation)
            if isinstance(ann, type) and issubclass(ann, int) and not issubclass(ann, bool):
                ints.update(names)
            extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
            if extra.get("deprecated"):
                deprecated[name] = extra.get("new_param", "")
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                dump(ann, f"{prefix}.{name}", out)
        out[prefix] = (frozenset(keys), frozenset(ints), {a: c for a, c in keys.items() if a != c}, deprecated)

    out = {}
    for name, cls in roots.items():
        dump(cls, name, out)
    return out


def _top_level_reads():
    """Every top-level key DeepSpeedConfig looks up, recorded with a dict that logs lookups."""
    seen = set()

    class Keys:
        def __init__(self, d):
            self.d = d

        def __contains__(self, k):
            seen.add(k)
            return dict.__contains__(self.d, k)

        def __iter__(self):
            return iter(dict.keys(self.d))

    class Recording(dict):
        def get(self, k, default=None):
            seen.add(k)
            return super().get(k, default)

        def __getitem__(self, k):
            seen.add(k)
            return super().__getitem__(k)

        def __contains__(self, k):
            seen.add(k)
            return super().__contains__(k)

        def keys(self):
            return Keys(self)

        def __copy__(self):
            return self

    _ds_config(Recording(_cfg()))
    return seen


@pytest.mark.witness
def test_data_matches_installed_deepspeed():
    """data_ds.py is what the installed DeepSpeed's models and DeepSpeedConfig actually read."""
    import deepspeed

    from zeropilot.rules import data_ds

    if deepspeed.__version__.split("+")[0] != data_ds.DATA_VERSION:
        pytest.skip(f"data is for DeepSpeed {data_ds.DATA_VERSION}, installed {deepspeed.__version__}")
    derived = _derive_sections()
    shipped = {k: v for k, v in data_ds.STRICT_SECTIONS.items() if k != "tensor_parallel.tp"}
    assert set(derived) == set(shipped)
    for name, (keys, ints, canonical, deprecated) in derived.items():
        sec = shipped[name]
        assert (sec.keys, sec.int_fields, sec.canonical, sec.deprecated) == (keys, ints, canonical, deprecated), name
    # sequence_parallel_size / data_parallel_size are read by deepspeed.initialize, not DeepSpeedConfig
    assert _top_level_reads() == data_ds.TOP_LEVEL_KEYS - {"sequence_parallel_size", "data_parallel_size"}
    assert set(data_ds.REMOVED_TOP_LEVEL) <= data_ds.TOP_LEVEL_KEYS


# ---- DS001 unknown key in a strict section ----------------------------------------------------------------

def test_ds001_fires_on_seed_001_keys(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 3, "stage3_offload_optimizer": True,
                                                         "stage3_offload_param": True}}})
    findings = run_check(root, versions=DS_NEW, select={"DS001"})
    assert codes(findings) == ["DS001", "DS001"]
    assert all(f.severity.value == "error" for f in findings)
    assert '"offload_optimizer": {"device": "cpu"' in findings[0].message


def test_ds001_did_you_mean_and_auto_is_warning(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 3, "reduce_bucket_sise": "auto",
                                                         "offload_param": {"device": "cpu", "pin_memroy": True}},
                                   "bf16": {"enabled": True, "immediate_grad_updte": False}}})
    by_key = {f.key: f for f in run_check(root, versions=DS_NEW, select={"DS001"})}
    assert set(by_key) == {"zero_optimization.reduce_bucket_sise", "zero_optimization.offload_param.pin_memroy",
                           "bf16.immediate_grad_updte"}
    assert by_key["zero_optimization.reduce_bucket_sise"].severity.value == "warning"
    assert "`reduce_bucket_size`" in by_key["zero_optimization.reduce_bucket_sise"].message
    assert "`pin_memory`" in by_key["zero_optimization.offload_param.pin_memroy"].message


def test_ds001_bf16_section_not_strict_before_0_17_1(launch_dir):
    root = launch_dir({"ds.json": {"bf16": {"enabled": True, "immediate_grad_updte": False}}})
    assert run_check(root, versions="deepspeed=0.16.4", select={"DS001"}) == []


def test_ds001_quiet_on_real_keys_and_aliases(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {
        "stage": 3, "prefetch_bucket_size": 5e7, "stage3_max_live_parameters": 1e9, "cpu_offload": False,
        "stage3_gather_16bit_weights_on_model_save": True, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16}, "tensorboard": {"enabled": False}}})
    assert run_check(root, versions=DS_NEW, select={"DS001"}) == []


@pytest.mark.witness
def test_ds001_witness():
    """Each strict section refuses an unknown key; a misspelled key set to "auto" passes silently."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="stage3_offload_optimizer"):
        _ds_config(_cfg(zero_optimization={"stage": 3, "stage3_offload_optimizer": True}))
    cfg = _ds_config(_cfg(zero_optimization={"stage": 3, "reduce_bucket_sise": "auto"}))
    assert cfg.zero_config.reduce_bucket_size == 5e8
    with pytest.raises(ValidationError, match="pin_memroy"):
        _ds_config(_cfg(zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": True}}))
    with pytest.raises(ValidationError, match="immediate_grad_updte"):
        _ds_config(_cfg(bf16={"enabled": True, "immediate_grad_updte": False}))
    for section in ("tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "compile", "hybrid_engine",
                    "tensor_parallel", "weight_quantization"):
        with pytest.raises(ValidationError):
            _ds_config(_cfg(**{section: {"zz_unknown": 1}}))


# ---- DS002 unknown top-level key --------------------------------------------------------------------------

def test_ds002_fires_on_typos(launch_dir):
    root = launch_dir({"ds.json": {"train_micro_batch_size_per_gpu": 1, "gradient_clip": 1.0,
                                   "zero_optimisation": {"stage": 3}, "monitor_config": {"enabled": True}}})
    by_key = {f.key: f for f in run_check(root, versions=DS_NEW, select={"DS002"})}
    assert set(by_key) == {"gradient_clip", "zero_optimisation", "monitor_config"}
    assert by_key["zero_optimisation"].severity.value == "error"
    assert "ZeRO stays off" in by_key["zero_optimisation"].message
    assert by_key["gradient_clip"].severity.value == "error"
    assert by_key["monitor_config"].severity.value == "warning"


def test_ds002_quiet_on_comments_and_known_keys(launch_dir):
    root = launch_dir({"ds.json": {"_comment": "tp", "train_micro_batch_size_per_gpu": 1, "bfloat16": {},
                                   "steps_per_print": 1e5, "zero_optimization": {"stage": 1},
                                   "activation_checkpointing": {}, "sequence_parallel_size": 1}})
    assert run_check(root, versions=DS_NEW, select={"DS002"}) == []


@pytest.mark.witness
def test_ds002_witness():
    """DeepSpeed ignores a misspelled top-level key: the real setting keeps its default."""
    cfg = _ds_config(_cfg(gradient_clip=0.5, zero_optimisation={"stage": 3}))
    assert cfg.gradient_clipping == 1.0
    assert cfg.zero_optimization_stage == 0


# ---- DS003 fractional float for an integer field ----------------------------------------------------------

def test_ds003_fires_on_fraction_not_on_whole_floats(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 15099494.4,
                                                         "sub_group_size": 1e9, "reduce_bucket_size": 5e8}}})
    findings = run_check(root, versions=DS_NEW, select={"DS003"})
    assert [f.key for f in findings] == ["zero_optimization.stage3_prefetch_bucket_size"]
    assert findings[0].severity.value == "error"
    old = run_check(root, versions="deepspeed=0.14.2+das.opt1.dtk25041", select={"DS003"})
    assert [f.severity.value for f in old] == ["warning"]


@pytest.mark.witness
def test_ds003_witness():
    """A fractional float is refused (int_from_float); whole floats like 1e9 are converted."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="int_from_float|fractional part"):
        _ds_config(_cfg(zero_optimization={"stage": 3, "stage3_prefetch_bucket_size": 15099494.4}))
    cfg = _ds_config(_cfg(zero_optimization={"stage": 3, "sub_group_size": 1e9, "reduce_bucket_size": 5e8}))
    assert cfg.zero_config.sub_group_size == 1_000_000_000 and isinstance(cfg.zero_config.sub_group_size, int)


# ---- DS004 "auto" without an HF integration ---------------------------------------------------------------

RAW_SCRIPT = "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, config='ds.json')\n"


def test_ds004_fires_without_hf(launch_dir):
    root = launch_dir({"ds.json": {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
                                   "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}},
                       "train.py": RAW_SCRIPT})
    by_key = {f.key: f.severity.value for f in run_check(root, versions=DS_NEW, select={"DS004"})}
    assert by_key == {"train_batch_size": "error", "zero_optimization.reduce_bucket_size": "warning"}


def test_ds004_quiet_under_hf(launch_dir):
    root = launch_dir({"ds.json": {"train_batch_size": "auto", "zero_optimization": {"stage": 3}},
                       "train.yaml": "output_dir: out\ndeepspeed: ds.json\nper_device_train_batch_size: 2\n"})
    assert run_check(root, versions=DS_NEW, select={"DS004"}) == []
    alone = launch_dir({"ds.json": {"train_batch_size": "auto"}})
    assert run_check(alone, versions=DS_NEW, select={"DS004"}) == []


@pytest.mark.witness
def test_ds004_witness():
    """Unfilled "auto": a TypeError for the batch size, the default for a section value."""
    from deepspeed.runtime.config import DeepSpeedConfig

    with pytest.raises(TypeError):
        DeepSpeedConfig({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2})
    cfg = _ds_config(_cfg(zero_optimization={"stage": 3, "reduce_bucket_size": "auto"}))
    assert cfg.zero_config.reduce_bucket_size == 5e8


# ---- DS005 fp16 and bf16 --------------------------------------------------------------------------------

def test_ds005_fires_on_both_enabled(launch_dir):
    root = launch_dir({"ds.json": {"fp16": {"enabled": True}, "bf16": {"enabled": True},
                                   "zero_optimization": {"stage": 2}}})
    findings = run_check(root, select={"DS005"})
    assert codes(findings) == ["DS005"]
    assert findings[0].key == "bf16.enabled" and findings[0].line == 6


def test_ds005_quiet_on_auto(launch_dir):
    root = launch_dir({"ds.json": {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
                                   "zero_optimization": {"stage": 2}}})
    assert run_check(root, select={"DS005"}) == []


@pytest.mark.witness
def test_ds005_witness():
    """DeepSpeed itself refuses a config with fp16 and bf16 both enabled."""
    from deepspeed.runtime.config import DeepSpeedConfig

    with pytest.raises(AssertionError, match="bfloat16 and fp16 modes cannot be simultaneously enabled"):
        DeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                         "bf16": {"enabled": True}})


# ---- DS006 batch identity ---------------------------------------------------------------------------------

BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}


def test_ds006_fires_with_known_world_size(launch_dir):
    root = launch_dir({"ds.json": BATCH})
    findings = run_check(root, versions=DS_NEW, world_size=1, select={"DS006"})
    assert codes(findings) == ["DS006"] and "set it to 16" in findings[0].message
    assert run_check(root, versions=DS_NEW, world_size=4, select={"DS006"}) == []
    assert run_check(root, versions=DS_NEW, select={"DS006"}) == []  # world size unknown


@pytest.mark.witness
def test_ds006_witness():
    """Without a process group DeepSpeedConfig uses world size 1: 64 != 4 * 4 * 1 is its assertion."""
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        _ds_config(dict(BATCH))
    _ds_config(dict(BATCH, train_batch_size=16))


@pytest.mark.witness
@pytest.mark.slow
def test_ds006_witness_world_size(engine_probe, launch_dir):
    """At data-parallel world size 2 and 4 (gloo up, world size from the mpu) DeepSpeed agrees with DS006."""
    root = launch_dir({"ds.json": BATCH})
    assert "train_batch_size is not equal" in engine_probe["batch_world_2"]
    assert codes(run_check(root, versions=DS_NEW, world_size=2, select={"DS006"})) == ["DS006"]
    assert engine_probe["batch_world_4"] == "ok"
    assert run_check(root, versions=DS_NEW, world_size=4, select={"DS006"}) == []


# ---- DS007 duplicate keys ---------------------------------------------------------------------------------

DUP = '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 2,\n    "stage": 3}\n}\n'


def test_ds007_fires_error_raw_warning_under_hf(launch_dir):
    root = launch_dir({"ds.json": DUP})
    findings = run_check(root, versions=DS_NEW, select={"DS007"})
    assert [(f.key, f.line, f.severity.value) for f in findings] == [("zero_optimization.stage", 3, "error")]
    root = launch_dir({"ds.json": DUP, "train.yaml": "output_dir: o\ndeepspeed: ds.json\n"})
    findings = run_check(root, versions=DS_NEW, select={"DS007"})
    assert [f.severity.value for f in findings] == ["warning"] and "line 4" in findings[0].message


def test_ds007_quiet_without_duplicates(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 3}}})
    assert run_check(root, versions=DS_NEW, select={"DS007"}) == []


@pytest.mark.witness
def test_ds007_witness(tmp_path):
    """DeepSpeed refuses the file; json.load (the HF integration) keeps the last value."""
    path = tmp_path / "ds.json"
    path.write_text(DUP)
    with pytest.raises(ValueError, match="[Dd]uplicate"):
        _ds_config(str(path))
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    assert HfDeepSpeedConfig(str(path)).get_value("zero_optimization.stage") == 3


# ---- DS008 removed features -------------------------------------------------------------------------------

def test_ds008_fires_by_version(launch_dir):
    root = launch_dir({"ds.json": {"amp": {"enabled": True}, "sparse_attention": {"mode": "fixed"},
                                   "zero_optimization": {"stage": 3, "mics_shard_size": 8}}})
    assert {f.key for f in run_check(root, versions=DS_NEW, select={"DS008"})} == {
        "amp", "sparse_attention", "zero_optimization.mics_shard_size"}
    assert {f.key for f in run_check(root, versions="deepspeed=0.19.7", select={"DS008"})} == {
        "sparse_attention", "zero_optimization.mics_shard_size"}
    assert run_check(root, versions="deepspeed=0.19.6", select={"DS008"}) == []


@pytest.mark.witness
def test_ds008_witness():
    from deepspeed.runtime.config import DeepSpeedConfigError

    for block in ({"amp": {"enabled": True}}, {"sparse_attention": {"mode": "fixed"}},
                  {"zero_optimization": {"stage": 3, "mics_shard_size": 8}}):
        with pytest.raises(DeepSpeedConfigError, match="removed"):
            _ds_config(_cfg(**block))


# ---- DS009 ZeRO-3 settings below stage 3 ------------------------------------------------------------------

def test_ds009_fires_below_stage_3(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"},
                                                         "stage3_max_live_parameters": 1e9}}})
    by_key = {f.key: f.severity.value for f in run_check(root, versions=DS_NEW, select={"DS009"})}
    assert by_key == {"zero_optimization.offload_param": "warning",
                      "zero_optimization.stage3_max_live_parameters": "info"}


def test_ds009_quiet_at_stage_3_and_device_none(launch_dir):
    root = launch_dir({"a.json": {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
                       "b.json": {"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}}})
    assert run_check(root, versions=DS_NEW, select={"DS009"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ds009_witness(engine_probe):
    """A real ZeRO-2 engine given offload_param builds the stage-1/2 optimizer: nothing is partitioned."""
    assert engine_probe["stage"] == 2
    assert engine_probe["optimizer"] == "DeepSpeedZeroOptimizer"
    assert engine_probe["params_partitioned"] is False
    assert engine_probe["param_offload_in_optimizer"] is False


# ---- DS010 gradient clipping default ----------------------------------------------------------------------

def test_ds010_fires_when_absent_on_new_deepspeed(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 2}}})
    assert codes(run_check(root, versions=DS_NEW, select={"DS010"})) == ["DS010"]
    assert run_check(root, versions="deepspeed=0.18.0", select={"DS010"}) == []


def test_ds010_quiet_when_set(launch_dir):
    root = launch_dir({"ds.json": {"gradient_clipping": "auto", "zero_optimization": {"stage": 2}}})
    assert run_check(root, versions=DS_NEW, select={"DS010"}) == []


@pytest.mark.witness
def test_ds010_witness():
    """Absent gradient_clipping is 1.0 in DeepSpeed 0.19.8 (PR #8068; 0.0 before 0.19.3)."""
    assert _ds_config(_cfg()).gradient_clipping == 1.0


def test_ds001_compile_section_by_version(launch_dir):
    """axolotl's torch_compile configs use compile keys 0.19.8 lacks: ignored up to 0.16, refused since 0.17.0."""
    root = launch_dir({"ds.json": {"train_micro_batch_size_per_gpu": 1,
                                   "compile": {"disable": False, "backend": "inductor"}}})
    assert {f.key for f in run_check(root, versions=DS_NEW, select={"DS001"})} == {"compile.disable",
                                                                                  "compile.backend"}
    assert run_check(root, versions="deepspeed=0.16.4", select={"DS001"}) == []
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="backend"):
        _ds_config(_cfg(compile={"disable": False, "backend": "inductor"}))


@pytest.mark.parametrize("cfg", [
    {"train_batch_size": 8, "zero_optimization": True},
    {"train_batch_size": 8, "zero_optimization": "auto", "fp16": "yes", "bf16": None},
    {"train_batch_size": "8", "train_micro_batch_size_per_gpu": [1], "gradient_accumulation_steps": {"a": 1},
     "zero_optimization": {"stage": "3", "offload_param": "cpu", "stage3_prefetch_bucket_size": float("nan")}},
    {"train_batch_size": 8, "optimizer": {"params": [0.1]}, "scheduler": "WarmupLR",
     "zero_optimization": {"stage": 2, "offload_param": {"device": None}}},
])
def test_rules_do_not_raise_on_odd_values(launch_dir, cfg):
    """Values of the wrong type are skipped or reported, never a crash (with HF args linked, too)."""
    root = launch_dir({"ds.json": cfg, "train.yaml": "output_dir: o\ndeepspeed: ds.json\nlearning_rate: x\n"
                                                     "gradient_accumulation_steps: [2]\nmax_steps: abc\n"})
    from zeropilot.rules import all_rules

    select = {r.code for r in all_rules() if r.code[:2] in ("DS", "HF", "AC", "VR")}
    assert len(select) > 10
    for versions in (DS_NEW, "deepspeed=0.16.0,transformers=4.46.1,accelerate=0.30.0"):
        run_check(root, versions=versions, world_size=2, select=select)


# ---- DS011 allgather_bucket_size at stage 3 -----------------------------------------------------------------

def test_ds011_fires_at_stage_3_only(launch_dir):
    root = launch_dir({"a.json": {"zero_optimization": {"stage": 3, "allgather_bucket_size": 2e8}},
                       "b.json": {"zero_optimization": {"stage": 2, "allgather_bucket_size": 2e8}}})
    findings = run_check(root, versions=DS_NEW, select={"DS011"})
    assert [(Path(f.file).name, f.key) for f in findings] == [("a.json", "zero_optimization.allgather_bucket_size")]


@pytest.mark.witness
def test_ds011_witness():
    """Only the stage-1/2 and bf16 optimizers of the installed DeepSpeed take allgather_bucket_size."""
    import inspect

    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    assert "allgather_bucket_size" in inspect.signature(DeepSpeedZeroOptimizer.__init__).parameters
    assert "allgather_bucket_size" in inspect.signature(BF16_Optimizer.__init__).parameters
    assert "allgather_bucket_size" not in inspect.signature(DeepSpeedZeroOptimizer_Stage3.__init__).parameters
    stage3 = inspect.getsource(DeepSpeedEngine._configure_zero_optimizer).split("ZeroStageEnum.weights")[-1]
    assert "allgather_bucket_size" not in stage3


def test_ds008_unknown_version_is_a_warning(launch_dir):
    root = launch_dir({"ds.json": {"train_batch_size": 8, "amp": {"enabled": True}}})
    assert [f.severity.value for f in run_check(root, select={"DS008"})] == ["warning"]


# ---- DS012 deprecated zero keys ---------------------------------------------------------------------------

def test_ds012_fires_and_renames_safely(launch_dir):
    from zeropilot.fix.edits import apply_to_text

    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 3, "cpu_offload": True,
                                                         "cpu_offload_use_pin_memory": True,
                                                         "stage3_gather_fp16_weights_on_model_save": True}}})
    findings = run_check(root, versions=DS_NEW, select={"DS012"})
    by_key = {f.key: f for f in findings}
    assert set(by_key) == {"zero_optimization.cpu_offload", "zero_optimization.cpu_offload_use_pin_memory",
                           "zero_optimization.stage3_gather_fp16_weights_on_model_save"}
    assert by_key["zero_optimization.cpu_offload_use_pin_memory"].severity.value == "warning"
    fixes = [f.fix for f in findings if f.fix is not None]
    assert len(fixes) == 1 and fixes[0].applicability.value == "safe"
    path = root / "ds.json"
    new, _ = apply_to_text(path.read_text(), list(fixes[0].edits))
    assert json.loads(new)["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def test_ds012_quiet_on_new_names(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                         "stage3_gather_16bit_weights_on_model_save": True}}})
    assert run_check(root, versions=DS_NEW, select={"DS012"}) == []


@pytest.mark.witness
def test_ds012_witness():
    """DeepSpeed maps the deprecated names to the new fields, and drops cpu_offload_use_pin_memory."""
    zc = _ds_config(_cfg(zero_optimization={"stage": 3, "cpu_offload": True, "cpu_offload_param": True,
                                            "stage3_gather_fp16_weights_on_model_save": True})).zero_config
    assert zc.offload_optimizer.device == "cpu" and zc.offload_param.device == "cpu"
    assert zc.gather_16bit_weights_on_model_save is True
    zc = _ds_config(_cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False},
                                            "cpu_offload_use_pin_memory": True})).zero_config
    assert zc.offload_optimizer.pin_memory is False
