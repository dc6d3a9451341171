import pytest

from tests.conftest import codes, run_check


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
