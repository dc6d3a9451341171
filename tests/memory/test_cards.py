"""The card table: names users type, names PyTorch reports, and a source for every figure."""

import pytest

from zeropilot.errors import InputError
from zeropilot.memory.cards import CARDS, PCIE_LANE_BYTES_PER_S, is_card, known_names, lookup, match_device
from zeropilot.memory.inputs import has_count, parse_gpus

MIB = 1024**2


@pytest.mark.parametrize("name,key", [
    ("H100", "H100-SXM"), ("h100-80gb", "H100-SXM"), ("H100-PCIe", "H100-PCIe"), ("H200", "H200"),
    ("A100", "A100-40GB"), ("A100-40GB", "A100-40GB"), ("a100_80gb", "A100-80GB"), ("A800", "A800"),
    ("L40S", "L40S"), ("4090", "RTX4090"), ("RTX4090", "RTX4090"), ("rtx 4090", "RTX4090"), ("MI250X", "MI250X"),
    ("mi300x", "MI300X"), ("K100_AI", "K100-AI"), ("k100-ai", "K100-AI"), ("K100", "K100"), ("BW200", "BW200"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA A100-SXM4-40GB", "A100-40GB")])
def test_names_users_type_are_case_and_dash_blind(name, key):
    assert lookup(name).key == key and is_card(name)


@pytest.mark.parametrize("device,key", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A800-SXM4-80GB", "A800"), ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ("AMD Instinct MI300X", "MI300X"), ("AMD Instinct MI300X VF", "MI300X"), ("AMD Instinct MI250X", "MI250X"),
    ("K100_AI", "K100-AI")])
def test_device_names_torch_reports_match_their_card(device, key):
    assert match_device(device).key == key


@pytest.mark.parametrize("device", ["NVIDIA H100 NVL", "NVIDIA A100-PCIE-40GB", "NVIDIA H800", "Tesla V100-SXM2-16GB",
                                    "", "NVIDIA"])
def test_a_card_the_table_does_not_hold_is_not_matched_by_a_substring(device):
    assert match_device(device) is None


def test_an_unknown_name_is_one_input_error_listing_the_known_ones():
    with pytest.raises(InputError) as err:
        lookup("H800")
    message = str(err.value)
    assert "H800" in message and "\n" not in message
    assert all(key in message for key in CARDS) and known_names() in message


def test_every_figure_has_a_source_and_a_plausible_value():
    for card in CARDS.values():
        specs = [card.memory_bytes, card.bf16_flops_per_s, card.mem_bytes_per_s, card.intra_bytes_per_s,
                 card.host_bytes_per_s()]
        assert all(len(s.source) > 10 for s in specs), card.key
        assert card.vendor in ("cuda", "rocm") and card.aliases and card.device_names and card.intra_link
        for spec, low, high in zip(specs, (8 * 2**30, 50e12, 300e9, 10e9, 10e9), (256 * 2**30, 3e15, 1e13, 1e12, 1e11)):
            assert spec.value is None or low <= spec.value <= high, (card.key, spec)


def test_the_measured_cards_hold_what_their_datasheets_and_nvidia_smi_say():
    h100, h200 = CARDS["H100-SXM"], CARDS["H200"]
    assert h100.memory_bytes.value == 81559 * MIB and h200.memory_bytes.value == 143771 * MIB  # nvidia-smi here
    assert h100.bf16_flops_per_s.value == h200.bf16_flops_per_s.value == pytest.approx(989.5e12)
    assert h100.mem_bytes_per_s.value == 3.35e12 and h200.mem_bytes_per_s.value == 4.8e12
    assert h100.host_bytes_per_s().value == pytest.approx(63.0e9, rel=1e-3)  # PCIe Gen5 x16, one way
    assert CARDS["A100-40GB"].host_bytes_per_s().value == pytest.approx(31.5e9, rel=1e-3)
    assert PCIE_LANE_BYTES_PER_S[4] * 16 * 2 == pytest.approx(63e9, rel=1e-2)  # "64 GB/s bidirectional"


def test_cards_without_public_figures_say_so_instead_of_guessing():
    z100, k100 = CARDS["Z100"], CARDS["K100"]
    assert z100.memory_bytes.value is None and z100.bf16_flops_per_s.value is None
    assert k100.bf16_flops_per_s.value is None and "NA" in k100.bf16_flops_per_s.source
    assert CARDS["K100-AI"].host_bytes_per_s().value is None and "not found" in CARDS["K100-AI"].host_source
    assert "one GCD is one torch device" in CARDS["MI250X"].note
    assert CARDS["MI250X"].memory_bytes.value == 68702699520


@pytest.mark.parametrize("text,count,key", [
    ("4xH100", 4, "H100-SXM"), ("1xA100-40GB", 1, "A100-40GB"), ("8xMI300X", 8, "MI300X"), ("8XMI300X", 8, "MI300X"),
    ("2 x h200", 2, "H200"), ("4*L40S", 4, "L40S"), ("4x4090", 4, "RTX4090"), ("8xK100_AI", 8, "K100-AI")])
def test_gpus_takes_a_cards_name_and_its_memory_from_the_table(text, count, key):
    hw = parse_gpus(text, nodes=2)
    assert (hw.gpus_per_node, hw.card, hw.nodes, hw.name) == (count, key, 2, text.strip())
    assert hw.gpu_bytes == CARDS[key].memory_bytes.value and hw.world_size == 2 * count


def test_gpus_with_memory_has_no_card_and_a_bare_number_is_still_gib():
    assert parse_gpus("4x16GiB").card is None and parse_gpus("4x80").gpu_bytes == 80 * 2**30


@pytest.mark.parametrize("text,counted", [("MI300X", False), ("H100", False), ("16GiB", False), ("4090", False),
                                          ("4xH100", True), ("8xMI300X", True), ("4x16GiB", True)])
def test_a_cards_own_x_is_not_a_count(text, counted):
    assert has_count(text) is counted


@pytest.mark.parametrize("text,match", [("4xH800", "COUNTxCARD"), ("8xZ100", "no memory figure for Z100"),
                                        ("0xH100", "COUNTxMEM"), ("H100", "COUNTxMEM")])
def test_bad_gpus_are_one_input_error(text, match):
    with pytest.raises(InputError, match=match):
        parse_gpus(text)


def test_the_docs_page_shows_the_table_and_the_ratios_as_the_code_has_them():
    from pathlib import Path

    from zeropilot.memory.cards import markdown
    from zeropilot.memory.speed import default_ratios

    page = (Path(__file__).resolve().parents[2] / "docs" / "cards.md").read_text(encoding="utf-8")
    table = page.split("<!-- cards:begin -->\n", 1)[1].split("<!-- cards:end -->", 1)[0]
    assert table == markdown()
    ratios = default_ratios()
    for name, fmt in (("matmul", ".3f"), ("attention", ".2f"), ("mem", ".3f"), ("h2d", ".3f"), ("intra", ".3f")):
        assert f"| {format(ratios[name].value, fmt)} |" in page, name
