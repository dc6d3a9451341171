from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings, strategies as st

from zeropilot.errors import InputError
from zeropilot.launch.yamlread import parse_yaml

P = Path("train.yaml")


def test_values_like_safe_load():
    text = "a: 1\nb: 1.0e-4\nc: 1e-4\nd: [x, 2]\ne:\n  f: true\n  g: ~\n"
    assert parse_yaml(text, P).plain() == yaml.safe_load(text)


def test_positions_keep_comments_outside_spans():
    text = "save_only_model: true  # keep\nddp_timeout: 18000000\n"
    root = parse_yaml(text, P)
    node = root.child("ddp_timeout")
    assert (node.line, node.value, node.path) == (2, 18000000, "ddp_timeout")
    assert text[root.child("save_only_model").start:root.child("save_only_model").end] == "true"


def test_duplicate_keys_recorded():
    root = parse_yaml("a: 1\na: 2\n", P)
    assert root.plain() == {"a": 2} and root.duplicates[0][0] == "a"


@pytest.mark.parametrize("text", ["", "\n  \n", "# a comment\n"])
def test_no_document_is_none_as_safe_load_reads_it(text):
    assert parse_yaml(text, P).value is None and yaml.safe_load(text) is None


def test_multiple_documents_take_the_first():
    assert parse_yaml("a: 1\n---\nb: 2\n", P).plain() == {"a": 1}


@pytest.mark.parametrize("text", ["a: [1,\n", "a: b: c\n", "\tfoo: 1\n", "a: 'x\n"])
def test_errors_are_input_errors_with_position(text):
    with pytest.raises(InputError) as info:
        parse_yaml(text, P)
    assert info.value.line is not None and "not valid YAML" in info.value.render()


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=200))
@example("*0")  # an undefined alias: found by this test once
@example("a: 1\n---\n*x")
@example("!!int ")  # PyYAML raises IndexError / AttributeError on these: found by a longer run
@example("!!float ")
@example("a: !!timestamp x")
def test_fuzz_never_crashes(text):
    try:
        parse_yaml(text, P)
    except InputError:
        pass
