"""Finding a model's config: local file or directory, catalogue names and Hub ids, clear errors."""

import json

import pytest

from zeropilot.errors import InputError
from zeropilot.models import HubAccess, from_config, normalise, resolve_model


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("ZEROPILOT_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.mark.parametrize("spec,key", [("Qwen/Qwen2-7B", "qwen2-7b"), ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
                                      ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
                                      ("google/gemma-2-2b-it", "gemma-2-2b"), ("/data/models/Qwen2-7B/", "qwen2-7b")])
def test_names_and_hub_ids_map_to_catalogue_keys(spec, key):
    assert normalise(spec) == key
    assert resolve_model(spec).source == "built-in catalogue"


def test_local_file_and_directory(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve_model(str(tmp_path)).hidden == 64
    assert resolve_model(str(tmp_path / "config.json")).kv_heads == 4
    assert resolve_model("config.json", base=tmp_path).layers == 2


def test_hf_cache_snapshot_is_read(tmp_path):
    snap = tmp_path / "hf" / "hub" / "models--acme--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
                                                  "num_hidden_layers": 1, "num_attention_heads": 2,
                                                  "vocab_size": 10}))
    assert resolve_model("acme/tiny").source.endswith("config.json")


def test_unknown_model_is_one_clear_error():
    with pytest.raises(InputError, match="offline"):
        resolve_model("acme/never-heard-of-it", hub=HubAccess.from_env())
    with pytest.raises(InputError, match="the Hub was not asked"):
        resolve_model("acme/never-heard-of-it")


def test_bad_json_names_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n  "hidden_size": }')
    with pytest.raises(InputError) as exc:
        resolve_model(str(tmp_path))
    assert exc.value.line == 2


@pytest.mark.parametrize("cfg,match", [({"model_type": "bert"}, "not one zeropilot can size"),
                                       ({"model_type": "llama", "hidden_size": 0}, "hidden_size")])
def test_unsupported_or_incomplete_configs(cfg, match):
    with pytest.raises(InputError, match=match):
        from_config(cfg, "x")
