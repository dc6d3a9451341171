"""From a launch path and options to a :class:`ReproSpec`: ``check`` first, then the launch's values, the model.

No torch. A launch that cannot be read, has no DeepSpeed config or names no model that can be found here is one
:class:`~zeropilot.errors.InputError` (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from zeropilot.errors import InputError
from zeropilot.repro.spec import Options, ReproSpec, build_spec, launch_settings

#: Stands in for a model the launch names but this machine cannot read, only where the model is shrunk anyway.
STAND_IN = "qwen2-7b"


def _check(paths: Sequence[str]) -> Tuple[Dict[str, Any], Any]:
    from zeropilot.check import check

    result, launch = check(list(paths))
    if result.read_errors:
        raise result.read_errors[0]
    if not launch.documents:
        raise InputError(f"no launch found in {', '.join(map(str, paths))}: no DeepSpeed config, training "
                         "arguments or launch script")
    codes = sorted({f.code for f in result.findings})
    sev = [str(getattr(f.severity, "value", f.severity)).lower() for f in result.findings]
    return {"errors": sum(s == "error" for s in sev), "warnings": sum(s == "warning" for s in sev),
            "codes": codes}, launch


def _model(settings, model: Optional[str], shrunk: bool, notes: List[str]) -> Tuple[Dict[str, Any], str]:
    """(config.json fields, name): ``--model``, else the launch's model, else (shrunk runs only) a stand-in."""
    from zeropilot.models.catalogue import lookup
    from zeropilot.models.resolve import resolve_model

    spec = model or settings.model
    if spec:
        try:
            base = None if model or not settings.model_base else Path(settings.model_base)
            arch = resolve_model(spec, base)
            return _config_of(spec, arch, model is not None, settings), spec
        except InputError as exc:
            if model or not shrunk:
                raise InputError(f"model {spec!r} cannot be read here ({exc.reason}); pass --model with its "
                                 "config.json or name, e.g. --model Qwen/Qwen2-7B") from None
            why = f"the launch's model {spec!r} cannot be read here"
    else:
        if not shrunk:
            raise InputError("the launch names no model (model_name_or_path): pass --model CONFIG|NAME")
        why = "the launch names no model"
    notes.append(f"{why}: the {STAND_IN} config stands in, shrunk (pass --model for the model's own config)")
    return dict(lookup(STAND_IN)), f"{STAND_IN} (stand-in)"


def _config_of(spec: str, arch, explicit: bool, settings) -> Dict[str, Any]:
    """The raw config.json fields behind a resolved model (the catalogue's, or the file's)."""
    from zeropilot.models.catalogue import lookup
    from zeropilot.models.resolve import read_config

    source = getattr(arch, "source", "") or ""
    if source and Path(source).is_file():
        data = read_config(Path(source))
        text = data.get("text_config") if isinstance(data.get("text_config"), dict) else None
        return dict(text or data)
    known = lookup(spec)
    if known is None:
        raise InputError(f"model {spec!r}: no config.json fields known here")
    return dict(known)


def prepare(paths: Sequence[str], model: Optional[str], opts: Options) -> Tuple[ReproSpec, Dict[str, Any]]:
    """Check the launch, read its values and model, and build the spec (see the module docstring)."""
    summary, launch = _check(paths)
    settings = launch_settings(launch)
    shrunk = opts.cpu and not opts.full_size
    config, name = _model(settings, model, shrunk, settings.notes)
    return build_spec(settings, config, name, opts), summary
