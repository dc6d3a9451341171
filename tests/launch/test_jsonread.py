import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from zeropilot.errors import InputError
from zeropilot.launch.jsonread import parse_json

P = Path("ds.json")


def test_values_like_json_load():
    text = '{"a": 1e9, "b": [1, 2.5, -3], "c": {"d": "auto", "e": null, "f": true}, "g": "\\u00e9\\n"}'
    assert parse_json(text, P).plain() == json.loads(text)
    assert isinstance(parse_json('{"x": 1e9}', P).child("x").value, float)


def test_positions_and_paths():
    text = '{\n  "zero_optimization": {\n    "stage": 3\n  }\n}\n'
    node = parse_json(text, P).child("zero_optimization").child("stage")
    assert (node.line, node.col, node.path, node.key_line) == (3, 14, "zero_optimization.stage", 3)
    assert text[node.start:node.end] == "3"


def test_duplicate_keys_keep_last_and_are_recorded():
    root = parse_json('{"a": 1,\n "a": 2}', P)
    assert root.plain() == {"a": 2}
    (key, first), = root.duplicates
    assert key == "a" and first.value == 1 and first.line == 1


def test_nan_and_infinity_as_python_json():
    root = parse_json('{"a": NaN, "b": -Infinity}', P)
    assert math.isnan(root.child("a").value) and root.child("b").value == float("-inf")


@pytest.mark.parametrize("text, line, col", [
    ('{"a": 1,,}', 1, 9),
    ('{"a": 1 /* open', 1, 9),
    ('{\n  "a": 1\n  "b": 2\n}', 3, 3),
    ('', 1, 1),
    ('{"a": "BATCH_SIZE}', 1, 7),
    ('{"a": $X}', 1, 7),
    ('[1, 2] 3', 1, 8),
])
def test_errors_name_line_and_column(text, line, col):
    with pytest.raises(InputError) as info:
        parse_json(text, P)
    assert (info.value.line, info.value.col) == (line, col)
    assert info.value.render().startswith(f"ds.json:{line}:{col}: not valid JSON")


def test_deep_nesting_is_an_input_error_not_a_recursion_error():
    with pytest.raises(InputError, match="nested too deeply"):
        parse_json("[" * 5000 + "]" * 5000, P)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_roundtrip_against_json_module(value):
    text = json.dumps(value, indent=1)
    assert parse_json(text, P).plain() == json.loads(text)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_never_crashes(text):
    try:
        parse_json(text, P)
    except InputError as exc:
        assert exc.line is not None
