"""A config with no settings in it (empty, whitespace, comments, ``---`` or ``null``) is an input error of the
launch, never a launch of defaults; the witness: the libraries that read such a file fail on it."""

from pathlib import Path

import pytest

from zeropilot.launch import load_launch
from zeropilot.launch.load import NO_SETTINGS

NO_VALUE = ["", "  \n\t\n", "# only a comment\n", "---\n", "null\n", "~\n"]


@pytest.mark.parametrize("text", NO_VALUE)
@pytest.mark.parametrize("name", ["train.yaml", "accelerate.yml"])
def test_a_yaml_without_a_value_is_a_read_error(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    launch = load_launch([path], use_installed=False)
    err, = launch.read_errors
    assert err.path == str(path) and err.reason == NO_SETTINGS and not launch.documents


@pytest.mark.parametrize("text,reason", [("", "not valid JSON: the file is empty"),
                                         (" \n\n", "not valid JSON: the file is empty"), ("null", NO_SETTINGS)])
def test_a_json_without_settings_is_a_read_error(tmp_path, text, reason):
    path = tmp_path / "ds.json"
    path.write_text(text)
    err, = load_launch([path], use_installed=False).read_errors
    assert err.reason == reason


def test_a_referenced_empty_config_is_a_read_error(tmp_path):
    """The DeepSpeed config a training YAML names, empty: found by following the reference, refused there."""
    (tmp_path / "train.yaml").write_text("deepspeed: ds.yaml\nper_device_train_batch_size: 1\n")
    (tmp_path / "ds.yaml").write_text("\n")
    launch = load_launch([tmp_path / "train.yaml"], use_installed=False)
    assert [Path(e.path).name for e in launch.read_errors] == ["ds.yaml"]


def test_an_empty_mapping_is_read(tmp_path):
    """``{}`` says "no settings" on purpose: read (a plan from it says what it assumed: tests/cli)."""
    (tmp_path / "ds.json").write_text("{}")
    launch = load_launch([tmp_path / "ds.json"], use_installed=False)
    assert not launch.read_errors and len(launch.documents) == 1


@pytest.mark.witness
@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n"])
def test_witness_accelerate_and_the_hf_argument_parser_fail_on_a_yaml_without_a_value(tmp_path, text):
    """accelerate's config loader (``ClusterConfig.from_yaml_file``: ``"compute_environment" not in None``) and
    ``HfArgumentParser.parse_yaml_file`` (``None.keys()``) both read ``yaml.safe_load``'s None and fail."""
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "a.yaml"
    path.write_text(text)
    with pytest.raises(TypeError):
        config_args.ClusterConfig.from_yaml_file(str(path))
    with pytest.raises(AttributeError):
        transformers.HfArgumentParser(transformers.TrainingArguments).parse_yaml_file(str(path))
