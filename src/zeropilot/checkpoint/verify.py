"""Compare an exported model or adapter with the checkpoint it came from, tensor for tensor.

Every tensor of OUT is rebuilt from the rank files and compared exactly: fp32 tensors with the fp32
master weights, others with the master weights cast to OUT's dtype (the cast export does). With
``load``, OUT is loaded with transformers (or PEFT, for an adapter) and runs one forward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from zeropilot import extras
from zeropilot.checkpoint import fsguard
from zeropilot.checkpoint import safetensors_writer as stw
from zeropilot.checkpoint.export import _LORA_RE, _adapter_key
from zeropilot.checkpoint.layout import read_layout
from zeropilot.checkpoint.reconstruct import DamagedCheckpoint, open_checkpoint
from zeropilot.errors import InputError


@dataclass
class VerifyResult:
    """Outcome of `verify`; ``ok`` when nothing differs and nothing is missing."""

    out: Path
    compared: int = 0
    mismatched: List[str] = field(default_factory=list)
    missing_in_out: List[str] = field(default_factory=list)
    extra_in_out: List[str] = field(default_factory=list)
    load: Optional[str] = None  # result of the forward with --load
    load_error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not (self.mismatched or self.missing_in_out or self.extra_in_out or self.load_error)


_SHARD_RE = re.compile(r"^[^/\\\x00]{1,255}\.safetensors$")


def _out_files(out: Path) -> List[Path]:
    """The safetensors files of the export `out`: from its index (names checked: files inside OUT only)."""
    if fsguard.kind_of(out) != "dir":
        raise InputError("not a folder: give the export's folder", out)
    conf = fsguard.Confinement.of(out)
    index = out / "model.safetensors.index.json"
    if fsguard.kind_of(index) is not None:
        data = fsguard.read_json(index, conf)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError("weight_map must be a JSON object of tensor name -> file name", index)
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if not _SHARD_RE.match(n) or n in (".", "..")]
        if bad or not names:
            raise InputError(f"weight_map names {bad[0][:80]!r} — not a shard file of this folder" if bad
                             else "weight_map is empty", index)
        return [conf.check(out / n) for n in names]
    for name in ("model.safetensors", "adapter_model.safetensors"):
        if fsguard.kind_of(out / name) is not None:
            return [conf.check(out / name)]
    raise InputError("no model.safetensors, shard index or adapter_model.safetensors here", out)


def _need_torch(load: bool, adapter: bool):
    """torch and safetensors' ``safe_open``; with ``load``, transformers (and PEFT for an adapter) too: the ``hf``
    extra, asked for before any tensor is compared."""
    why = "compares tensor values"
    extras.need("ckpt verify", why, "ckpt")
    if load:
        extras.need("ckpt verify --load", "loads the export and runs one forward", "hf",
                    ["transformers", "peft"] if adapter else ["transformers"])
    return extras.load("torch", "ckpt verify", why, "ckpt"), extras.load("safetensors", "ckpt verify", why,
                                                                          "ckpt").safe_open


def verify(out, against, tag: Optional[str] = None, load: bool = False, trust_pickle: bool = False,
           follow_symlinks: bool = False) -> VerifyResult:
    """Compare every tensor of the export `out` with the checkpoint `against`."""
    out = Path(out)
    files = _out_files(out)
    adapter = files[0].name == "adapter_model.safetensors"
    for f in files:  # a garbage or crafted file is one line, before safetensors sees it and before torch's import
        stw.read_header(f)
    torch, safe_open = _need_torch(load, adapter)
    layout = read_layout(against, tag, follow_symlinks=follow_symlinks)
    if layout.problems:
        raise DamagedCheckpoint("the checkpoint is damaged or incomplete", layout.problems)
    state = open_checkpoint(layout, trust_pickle=trust_pickle)
    if any(".base_layer." in e.name for e in state.entries) and not adapter:
        raise InputError("OUT is a merged model: merged weights are computed, not copied, so there is nothing "
                         "to compare exactly; verify the adapter (--adapter-only export) instead", out)
    expected = {}
    for e in state.entries:
        if adapter and not _LORA_RE.search(e.name):
            continue
        expected[_adapter_key(e.name) if adapter else e.name] = e
    result = VerifyResult(out=out)
    seen = set()
    for f in files:
        try:
            handle = safe_open(str(f), framework="pt")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error type for any bad file
            raise InputError(f"safetensors cannot open it ({str(exc).splitlines()[0][:120]})", f) from None
        with handle:
            for key in handle.keys():
                seen.add(key)
                entry = expected.get(key)
                if entry is None:
                    alias = state.aliases.get(key)
                    entry = state.entry(alias) if alias else None
                if entry is None:
                    result.extra_in_out.append(key)
                    continue
                got = handle.get_tensor(key)
                want = state.read(entry, got.dtype if got.is_floating_point() else None)
                result.compared += 1
                if got.shape != want.shape or not torch.equal(got, want):
                    result.mismatched.append(key)
    result.missing_in_out = [k for k in expected if k not in seen and k not in state.aliases]
    if load:
        _load_and_run(out, adapter, result)
    return result


def _load_and_run(out: Path, adapter: bool, result: VerifyResult) -> None:
    import torch

    try:
        if adapter:
            from peft import PeftConfig, PeftModel
            from transformers import AutoModelForCausalLM

            base = PeftConfig.from_pretrained(str(out)).base_model_name_or_path
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(out))
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(str(out))
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
        finite = bool(torch.isfinite(logits).all())
        result.load = f"loaded {type(model).__name__}; one forward: logits {tuple(logits.shape)}, " + (
            "all finite" if finite else "NOT finite")
        if not finite:
            result.load_error = "logits are not finite"
    except Exception as exc:  # noqa: BLE001 - any failure to load is the answer we report
        result.load_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


__all__ = ["VerifyResult", "verify"]
