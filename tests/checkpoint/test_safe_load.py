"""safe_load: the allowlist is exactly what real DeepSpeed files need; malicious pickles never run."""

from __future__ import annotations

import os
import pickletools
import zipfile

import pytest
import torch

from zeropilot.checkpoint import safe_load
from zeropilot.checkpoint.layout import read_layout

from .conftest import FULL, LORA, zeropilot

pytestmark = pytest.mark.slow

# Globals torch's weights_only unpickler allows by itself (seen in these files).
TORCH_OWN = {"collections.OrderedDict", "torch.Size", "torch.Tensor", "torch._utils._rebuild_tensor_v2",
             "torch._tensor._rebuild_from_type_v2", "torch.BFloat16Storage", "torch.FloatStorage"}
GETATTR = "builtins.getattr"


def _globals(path) -> set:
    with zipfile.ZipFile(path) as zf:
        data = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    ops = list(pickletools.genops(data))
    found = set()
    for i, (op, arg, _pos) in enumerate(ops):
        if op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            found.add(f"{ops[i - 2][1]}.{ops[i - 1][1]}")
    return found


def test_allowlist_is_exactly_what_deepspeed_files_need(checkpoints):
    seen = set()
    for name in FULL + LORA:
        layout = read_layout(checkpoints(name).path)
        for f in layout.rank_files:
            seen |= _globals(f.path)
            loaded = safe_load.load(f.path)  # weights_only=True with the allowlist
            assert isinstance(loaded, dict)
    # Python 3.11.2 (Debian 12's) pickles ZeroStageEnum members through getattr (its pickle says __builtin__)
    needed = {GETATTR if g == "__builtin__.getattr" else g for g in seen - TORCH_OWN}
    allowed = set(safe_load.DEEPSPEED_GLOBALS) | {GETATTR}
    assert needed <= allowed
    # Every 0.19.8 entry was needed by some file; DynamicLossScaler is fp16-only (no fp16 on CPU); getattr only
    # where this Python writes enum members by name.
    assert allowed - needed <= {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", GETATTR}


class _ByName:
    """Pickles as ``getattr(cls, name)``: how Python 3.11.2 writes an enum member, whatever Python runs the test."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name

    def __reduce__(self):
        return (getattr, (self.cls, self.name))


def test_an_enum_member_pickled_by_name_loads_and_no_other_getattr_does(tmp_path):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    good = tmp_path / "by_name.pt"
    torch.save({"zero_stage": _ByName(ZeroStageEnum, "optimizer_states")}, str(good))
    loaded = safe_load.load(good)
    assert isinstance(loaded["zero_stage"], safe_load.ZeroStageEnum) and loaded["zero_stage"] == 1
    for cls, name in ((ZeroStageEnum, "__class__"), (LossScaler, "__init__"), (ZeroStageEnum, "nope")):
        bad = tmp_path / f"bad_{name}.pt"
        torch.save({"x": _ByName(cls, name)}, str(bad))
        with pytest.raises(safe_load.UnsafePickleError) as err:
            safe_load.load(bad)
        assert err.value.global_name == "builtins.getattr"


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(path, marker):
    """Replace rank 0's optimizer file with one whose unpickling runs a shell command."""
    victim = read_layout(path).optim_file(0)
    torch.save({"optimizer_state_dict": {"zero_stage": 2, "evil": _Evil(marker)}}, str(victim))
    return victim


def test_malicious_pickle_is_refused_and_never_runs(checkpoints, tmp_path):
    path = checkpoints("z2_w2_bf16_tied").copy(tmp_path / "c")
    marker = tmp_path / "pwned"
    victim = _plant(path, marker)
    with pytest.raises(safe_load.UnsafePickleError) as err:
        safe_load.load(victim)
    assert err.value.global_name in ("posix.system", "os.system")
    assert "--trust-pickle" in str(err.value)
    inspect = zeropilot("ckpt", "inspect", path)
    export = zeropilot("ckpt", "export", path, tmp_path / "out")
    assert not marker.exists()
    assert inspect.returncode == 1 and "refused to unpickle" in inspect.stdout
    assert "stage: ZeRO-2" in inspect.stdout  # layout facts still come first
    assert export.returncode == 2 and "system" in export.stderr and "--trust-pickle" in export.stderr
    assert len(export.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_planted_pickle_is_really_malicious(tmp_path):
    """The same file does run its command under torch.load(weights_only=False), as zero_to_fp32 loads."""
    marker = tmp_path / "ran"
    f = tmp_path / "evil.pt"
    torch.save({"x": _Evil(marker)}, str(f))
    torch.load(str(f), weights_only=False)
    assert marker.exists()


def test_trust_pickle_loads_the_same_structure(checkpoints):
    layout = read_layout(checkpoints("z3_w2_bf16_tied").path)
    safe = safe_load.load(layout.optim_file(0))
    trusted = safe_load.load(layout.optim_file(0), trust_pickle=True)
    assert set(safe["optimizer_state_dict"]) == set(trusted["optimizer_state_dict"])
    flat_safe = safe["optimizer_state_dict"]["fp32_flat_groups"][0]
    # bitwise: the flat group ends in alignment padding DeepSpeed never writes (torch.empty), NaN at times
    flat_trusted = trusted["optimizer_state_dict"]["fp32_flat_groups"][0]
    assert torch.equal(flat_safe.view(torch.uint8), flat_trusted.view(torch.uint8))
    assert int(safe["optimizer_state_dict"]["zero_stage"]) == 3


def test_damaged_file_is_a_clear_error(tmp_path):
    f = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    f.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(safe_load.DamagedFileError, match="truncated or damaged"):
        safe_load.load(f)
