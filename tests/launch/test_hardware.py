from pathlib import Path

from zeropilot.launch.hardware import parse_nvidia_smi, visible_gpus


def test_parse_real_h200_output():
    """What `nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits` printed on the lent H200."""
    text = (Path(__file__).parents[1] / "data" / "nvidia_smi_h200.txt").read_text()
    assert parse_nvidia_smi(text) == "1x143771MiB"


def test_parse_nvidia_smi_output():
    text = "143771\n143771\n81559\n"  # memory.total in MiB, one line per GPU, as nvidia-smi prints it
    assert parse_nvidia_smi(text) == "3x81559MiB"
    assert parse_nvidia_smi(text, visible="0,1") == "2x143771MiB"
    assert parse_nvidia_smi(text, visible="GPU-1234") == "3x81559MiB"
    assert parse_nvidia_smi("No devices were found\n") is None
    assert parse_nvidia_smi("") is None


def test_visible_gpus_without_nvidia_smi(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert visible_gpus() is None
