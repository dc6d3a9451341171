"""``zeropilot.extras``: the modules it names for each extra are the ones ``pyproject.toml`` installs with it, and a
missing one is one line naming the extra (the commands that use it: tests/cli/test_missing_extras.py)."""

import re
import sys
from pathlib import Path

import pytest

from zeropilot import extras
from zeropilot.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _declared():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {extra: {re.split(r"[<>=!~;\[ ]", req, 1)[0].lower() for req in reqs} for extra, reqs in table.items()}


def test_every_extra_named_is_declared_with_its_modules():
    declared = _declared()
    for extra, modules in extras.EXTRAS.items():
        assert extra in declared, f"pyproject.toml has no [{extra}] extra"
        assert set(modules) <= declared[extra], (extra, set(modules) - declared[extra])


def test_a_missing_module_is_one_line_naming_the_extra():
    name = "zeropilot_no_such_module_xyz"
    assert extras.missing(["json", name]) == [name]
    with pytest.raises(InputError) as err:
        extras.need("repro", "trains with it", "repro", ["json", name])
    line = err.value.render()
    assert "\n" not in line and f"{name} is not installed here" in line and "pip install 'zeropilot[repro]'" in line
    with pytest.raises(InputError, match=r"zeropilot\[ckpt\]"):
        extras.load(name, "ckpt", "reads it", "ckpt")
    assert extras.load("json", "ckpt", "reads it", "ckpt").dumps([]) == "[]"


def test_a_launcher_is_named_with_its_package():
    assert "the torch package" in extras.program_hint("/opt/env/bin/torchrun")
    assert extras.program_hint("my-own-script.sh") == ""
