import pytest
import yaml

from tests.conftest import codes, run_check

LF = {"model_name_or_path": "Qwen/Qwen2-7B", "stage": "sft", "do_train": True, "finetuning_type": "lora",
      "template": "qwen", "dataset": "alpaca", "output_dir": "out", "deepspeed": "ds.json"}


def z3(gather=None):
    zero = {"stage": 3}
    if gather is not None:
        zero["stage3_gather_16bit_weights_on_model_save"] = gather
    return {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": zero}


def launch(launch_dir, ds, **train):
    return launch_dir({"ds.json": ds, "train.yaml": yaml.safe_dump({**LF, **train})})


# --- CK001 save-only-model-not-resumable -------------------------------------------------------------

def test_ck001_fires_with_gather(launch_dir):
    root = launch(launch_dir, z3(True), save_only_model=True, finetuning_type="full")
    findings = run_check(root, select={"CK001"})
    assert codes(findings) == ["CK001"] and findings[0].key == "save_only_model"


def test_ck001_quiet_without_save_only_model(launch_dir):
    assert run_check(launch(launch_dir, z3(True), save_only_model=False), select={"CK001"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ck001_witness():
    """ZeRO-3 + gather + save_only_model: only weights written, and resuming raises ValueError."""
    from tests.witness.sessions import trainer_saves

    case = trainer_saves()["z3_som_gather"]
    assert case["error"] is None
    names = set(case["files"])
    assert "checkpoint-2/model.safetensors" in names
    assert not any("global_step" in n or "optim" in n or "rng_state" in n or "scheduler" in n for n in names)
    assert case["resume_error"]["type"] == "ValueError"
    assert "Can't find a valid checkpoint" in case["resume_error"]["message"]


# --- CK002 save-only-model-ignored-without-gather ----------------------------------------------------

def test_ck002_fires_on_seed_shape(launch_dir):
    root = launch(launch_dir, z3(False), save_only_model=True, finetuning_type="full")
    findings = run_check(root, versions="transformers=5.24.0", select={"CK002"})
    assert codes(findings) == ["CK002"] and findings[0].key == "save_only_model"


def test_ck002_fires_when_gather_absent_and_lora_on_4x(launch_dir):
    root = launch(launch_dir, z3(None), save_only_model=True)
    assert codes(run_check(root, versions="transformers=4.46.1", select={"CK002"})) == ["CK002"]


def test_ck002_quiet_for_lora_on_5x_and_with_gather(launch_dir):
    assert run_check(launch(launch_dir, z3(False), save_only_model=True), versions="transformers=5.24.0",
                     select={"CK002"}) == []
    assert run_check(launch(launch_dir, z3(True), save_only_model=True, finetuning_type="full"),
                     select={"CK002"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ck002_witness():
    """ZeRO-3 without gather: save_only_model still writes every model and optimizer shard (full FT)."""
    from tests.witness.sessions import trainer_saves

    ignored = trainer_saves()["z3_som_nogather"]["files"]
    full = trainer_saves()["z3_full"]["files"]
    optim = [n for n in ignored if n.endswith("optim_states.pt")]
    assert len(optim) == 2 and all(ignored[n] > 100_000 for n in optim)
    assert "checkpoint-2/model.safetensors" not in ignored
    shards = lambda files: {n: s for n, s in files.items() if "global_step" in n}  # noqa: E731
    assert set(shards(ignored)) == set(shards(full))
    # ... while a PEFT model on transformers 5.x honours it (adapter only): the rule's exception.
    lora = trainer_saves()["z3_lora_som_nogather"]["files"]
    assert not any("global_step" in n for n in lora) and "checkpoint-2/adapter_model.safetensors" in lora


# --- CK003 save-only-model-with-load-best ------------------------------------------------------------

def test_ck003_fires(launch_dir):
    root = launch(launch_dir, z3(True), save_only_model=True, load_best_model_at_end=True)
    findings = run_check(root, versions="transformers=4.46.1", select={"CK003"})
    assert codes(findings) == ["CK003"] and findings[0].key == "load_best_model_at_end"


def test_ck003_quiet_before_4_38_and_without_load_best(launch_dir):
    root = launch(launch_dir, z3(True), save_only_model=True, load_best_model_at_end=True)
    assert run_check(root, versions="transformers=4.37.2", select={"CK003"}) == []
    assert run_check(launch(launch_dir, z3(True), save_only_model=True), select={"CK003"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ck003_witness():
    from tests.witness.sessions import trainer_saves

    err = trainer_saves()["load_best"]["error"]
    assert err["type"] == "ValueError" and "save_only_model" in err["message"]
    assert err["where"] == "transformers/trainer.py:create_accelerator_and_postprocess"


# --- CK004 frozen-base-in-every-checkpoint -----------------------------------------------------------

def test_ck004_fires_on_seed_with_4x(launch_dir):
    root = launch(launch_dir, z3(False), save_only_model=True)
    findings = run_check(root, versions="transformers=4.46.1", select={"CK004"})
    assert codes(findings) == ["CK004"]


def test_ck004_fires_on_any_save_before_4_37(launch_dir):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 2}},
                       "train.yaml": yaml.safe_dump(LF)})
    findings = run_check(root, versions="transformers=4.36.2", select={"CK004"})
    assert codes(findings) == ["CK004"] and findings[0].key == "finetuning_type"
    # ... but not with save_only_model at ZeRO-2: no engine save at all then.
    (root / "train.yaml").write_text(yaml.safe_dump({**LF, "save_only_model": True}))
    assert run_check(root, versions="transformers=4.36.2", select={"CK004"}) == []


def test_ck004_quiet(launch_dir):
    seed = launch(launch_dir, z3(False), save_only_model=True)
    assert run_check(seed, versions="transformers=5.24.0", select={"CK004"}) == []
    assert run_check(launch(launch_dir, z3(True), save_only_model=False), versions="transformers=4.46.1",
                     select={"CK004"}) == []
    full = launch(launch_dir, z3(False), save_only_model=True, finetuning_type="full")
    assert run_check(full, versions="transformers=4.46.1", select={"CK004"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ck004_witness():
    """Where the frozen base goes: the engine save transformers < 5.0 makes (no exclude flag) writes it into
    the model-states files (ZeRO-2: the whole of it in mp_rank_00; ZeRO-3: each rank's slice); with the
    flag, and through the 5.24 Trainer at ZeRO-2/3 with gather on or off, no file holds any of it."""
    from tests.witness.sessions import engine, trainer_saves

    both = engine("frozen", 2)
    for stage in (2, 3):
        run = both[f"z{stage}"]
        written = {n: k for n, k in run["all"].items() if k > 0}
        assert written and all("model_states" in n for n in written)
        assert sum(written.values()) >= 100_000  # the tiny model's ~107 k frozen elements
        assert all(k == 0 for k in run["exclude_frozen"].values())
    for name in ("z3_lora_nogather", "z3_lora_gather", "z3_lora_som_nogather", "z2_lora"):
        frozen = trainer_saves()[name]["frozen"]
        assert frozen and all(k <= 0 for k in frozen.values()), name


# --- CK005 zero3-save-model-writes-no-weights --------------------------------------------------------

def test_ck005_fires_on_full_ft(launch_dir):
    findings = run_check(launch(launch_dir, z3(None), finetuning_type="full"), select={"CK005"})
    assert codes(findings) == ["CK005"] and findings[0].key == "zero_optimization.stage"


def test_ck005_quiet_with_gather_or_lora(launch_dir):
    assert run_check(launch(launch_dir, z3(True), finetuning_type="full"), select={"CK005"}) == []
    assert run_check(launch(launch_dir, z3(False)), select={"CK005"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ck005_witness():
    from tests.witness.sessions import trainer_saves

    assert "checkpoint-2/model.safetensors" not in trainer_saves()["z3_full"]["files"]
    assert "checkpoint-2/model.safetensors" in trainer_saves()["z2_full"]["files"]


# --- CK006 resume-on-another-world-size --------------------------------------------------------------

@pytest.fixture(scope="module")
def two_rank_checkpoint():
    from tests.witness.sessions import root, trainer_saves

    trainer_saves()
    return root() / "saves" / "z2_full" / "checkpoint-2"


@pytest.mark.slow
def test_ck006_fires_on_resume_path(launch_dir, two_rank_checkpoint):
    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 2}},
                       "train.yaml": yaml.safe_dump({**LF, "resume_from_checkpoint": str(two_rank_checkpoint)}),
                       "run.sh": "NPROC_PER_NODE=4 FORCE_TORCHRUN=1 llamafactory-cli train train.yaml\n"})
    findings = run_check(root, select={"CK006"})
    assert codes(findings) == ["CK006"] and findings[0].key == "resume_from_checkpoint"
    assert "saved by 2 ranks" in findings[0].message and "starts 4" in findings[0].message


@pytest.mark.slow
def test_ck006_quiet_on_same_world_or_universal(launch_dir, two_rank_checkpoint):
    train = yaml.safe_dump({**LF, "resume_from_checkpoint": str(two_rank_checkpoint)})
    same = launch_dir({"ds.json": {"zero_optimization": {"stage": 2}}, "train.yaml": train,
                       "run.sh": "NPROC_PER_NODE=2 FORCE_TORCHRUN=1 llamafactory-cli train train.yaml\n"})
    assert run_check(same, select={"CK006"}) == []
    (same / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "checkpoint": {"load_universal": true}}')
    assert run_check(same, world_size=4, select={"CK006"}) == []


@pytest.mark.witness
@pytest.mark.slow
def test_ck006_witness():
    """A 2-rank ZeRO-2 and ZeRO-3 checkpoint resumed by 1 rank: ZeRORuntimeException on load."""
    from tests.witness.sessions import trainer_resume_other_world

    for name in ("z2_on_1", "z3_on_1"):
        err = trainer_resume_other_world()[name]["error"]
        assert err["type"] == "ZeRORuntimeException", name
        assert "DP world size of 2 but the current world size is 1" in err["message"]


@pytest.mark.slow
def test_ck006_follows_resume_true_and_checkpoints_beside_the_launch(launch_dir, two_rank_checkpoint):
    import shutil

    root = launch_dir({"ds.json": {"zero_optimization": {"stage": 2}},
                       "train.yaml": yaml.safe_dump({**LF, "resume_from_checkpoint": True, "output_dir": "out"}),
                       "run.sh": "NPROC_PER_NODE=4 FORCE_TORCHRUN=1 llamafactory-cli train train.yaml\n"})
    shutil.copytree(two_rank_checkpoint, root / "out" / "checkpoint-2")
    findings = run_check(root, select={"CK006"})
    assert codes(findings) == ["CK006"] and findings[0].key == "resume_from_checkpoint"
    assert findings[0].severity.value == "error"
    # Without resume_from_checkpoint the folder beside the launch is only a warning.
    (root / "train.yaml").write_text(yaml.safe_dump({**LF, "output_dir": "out"}))
    findings = run_check(root, select={"CK006"})
    assert codes(findings) == ["CK006"] and findings[0].severity.value == "warning"
    assert findings[0].key == "checkpoint"
