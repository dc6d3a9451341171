"""`zeropilot ckpt` end to end: exit codes, one-line errors, atomic and refusing writes."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.conftest import checkpoints, zeropilot  # noqa: F401 - the session fixture

pytestmark = pytest.mark.slow


def test_inspect_text_and_json(checkpoints):  # noqa: F811
    built = checkpoints("z3_w2_bf16_tied")
    text = zeropilot("ckpt", "inspect", built.path)
    assert text.returncode == 0, text.stderr
    assert "stage: ZeRO-3   world size: 2" in text.stdout and "verdict: OK" in text.stdout
    data = json.loads(zeropilot("ckpt", "inspect", built.path, "--format", "json").stdout)
    assert data["verdict"] == "ok" and data["stage"] == 3 and data["tensors"]["tied"] == {
        "lm_head.weight": "model.embed_tokens.weight"}


def test_inspect_damaged_checkpoint_names_the_files(checkpoints, tmp_path):  # noqa: F811
    path = checkpoints("z3_w2_bf16_tied").copy(tmp_path / "c")
    victim = path / "global_step2" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
    victim.write_bytes(victim.read_bytes()[:1000])
    proc = zeropilot("ckpt", "inspect", path)
    assert proc.returncode == 1
    assert "verdict: DAMAGED" in proc.stdout and str(victim) in proc.stdout
    export = zeropilot("ckpt", "export", path, tmp_path / "out")
    assert export.returncode == 1 and str(victim) in export.stderr and "Traceback" not in export.stderr
    assert not (tmp_path / "out").exists()


def test_export_refuses_existing_out_and_writes_nothing_into_path(checkpoints, tmp_path):  # noqa: F811
    built = checkpoints("z2_w2_bf16_tied")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    proc = zeropilot("ckpt", "export", built.path, out)
    assert proc.returncode == 2 and "--force" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (out / "keep").exists()
    inside = zeropilot("ckpt", "export", built.path, built.path / "exported")
    assert inside.returncode == 2 and "never writes there" in inside.stderr
    assert not (built.path / "exported").exists()
    forced = zeropilot("ckpt", "export", built.path, out, "--force", "--dtype", "fp32")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp sibling left
    check = zeropilot("ckpt", "verify", out, "--against", built.path)
    assert check.returncode == 0 and "verdict: OK" in check.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    for args in (("inspect", tmp_path / "missing"), ("inspect", tmp_path), ("export", tmp_path, tmp_path / "o"),
                 ("verify", tmp_path, "--against", tmp_path)):
        proc = zeropilot("ckpt", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("zeropilot: error:")


def test_adapter_only_on_a_full_model_is_refused(checkpoints, tmp_path):  # noqa: F811
    proc = zeropilot("ckpt", "export", checkpoints("z2_w2_bf16_tied").path, tmp_path / "o", "--adapter-only")
    assert proc.returncode == 2 and "no PEFT adapter" in proc.stderr
