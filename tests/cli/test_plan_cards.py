"""`--gpus` takes a card's name where it takes memory: `plan` and `check` with `4xH100`, `8xMI300X` (whose own x is
not a count), a card alone with the count from the launch, and an unknown card refused in one line."""

import json
from pathlib import Path

import pytest

from zeropilot.cli import main
from zeropilot.memory.cards import CARDS

SEED = str(Path(__file__).resolve().parents[2] / "examples" / "seed")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("ZEROPILOT_OFFLINE", "1")


def _plan(capsys, *argv):
    assert main(["plan", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("gpus,count,key", [("1xH100", 1, "H100-SXM"), ("8xMI300X", 8, "MI300X"),
                                            ("2xA100-40GB", 2, "A100-40GB")])
def test_plan_takes_the_cards_memory_from_the_table(capsys, gpus, count, key):
    doc = _plan(capsys, "--model", "qwen2.5-7b", "--gpus", gpus, "--stage", "3", "--lora-rank", "8", "--host-mem", "64")
    assert doc["hardware"]["gpus_per_node"] == count and doc["world_size"] == count
    assert doc["hardware"]["gpu_bytes"] == CARDS[key].memory_bytes.value
    assert doc["sources"]["hardware"] == f"flag --gpus {gpus}"


@pytest.mark.parametrize("card,key", [("H100", "H100-SXM"), ("MI300X", "MI300X")])
def test_a_card_alone_takes_its_count_from_the_launch(capsys, card, key):
    doc = _plan(capsys, SEED, "--model", "Qwen/Qwen2-7B", "--gpus", card)
    assert doc["world_size"] == 4 and doc["hardware"]["gpu_bytes"] == CARDS[key].memory_bytes.value


@pytest.mark.parametrize("gpus,match", [("4xH800", "H100-SXM, H100-PCIe"), ("H800", "COUNTxCARD"),
                                        ("8xZ100", "no memory figure for Z100")])
def test_an_unknown_card_is_one_line_and_exit_2(capsys, gpus, match):
    assert main(["plan", SEED, "--model", "Qwen/Qwen2-7B", "--gpus", gpus]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err and err.count("\n") == 1


def test_check_reads_a_card_whose_name_holds_an_x(capsys):
    assert main(["check", SEED, "--gpus", "MI300X", "--format", "json"]) != 2
    assert json.loads(capsys.readouterr().out)["findings"] is not None
    assert main(["check", SEED, "--gpus", "H800"]) == 2
    assert "COUNTxCARD" in capsys.readouterr().err
