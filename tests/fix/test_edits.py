import json
import os
import stat

import yaml

from zeropilot.fix.edits import apply_edits, delete_member, diff, planned, rename_key, replace_value
from zeropilot.launch.document import Document
from zeropilot.launch.jsonread import parse_json
from zeropilot.launch.yamlread import parse_yaml

JSON = """{
  "train_batch_size": "auto",
  "gradient_accumulation_steps": 1,
  "zero_optimization": {
    "stage": 3,
    "stage3_offload_optimizer": true,
    "overlap_comm": false
  }
}
"""
YAML = """### train
per_device_train_batch_size: 1   # keep me
gradient_accumulation_steps: 16
sharded_ddp: zero3
bf16: true
"""


def doc(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    parse = parse_json if name.endswith(".json") else parse_yaml
    return Document(path, "x", "json" if name.endswith(".json") else "yaml", parse(text, path), text)


def apply(d, *edits):
    changes = planned(edits, {d.path: d.text})
    apply_edits(changes)
    return d.path.read_text()


def test_json_replace_keeps_everything_else(tmp_path):
    d = doc(tmp_path, "ds.json", JSON)
    out = apply(d, replace_value(d, d.get("gradient_accumulation_steps"), "auto"))
    assert out == JSON.replace('"gradient_accumulation_steps": 1', '"gradient_accumulation_steps": "auto"')


def test_json_delete_middle_first_and_last(tmp_path):
    d = doc(tmp_path, "ds.json", JSON)
    out = apply(d, delete_member(d, d.get("zero_optimization.stage3_offload_optimizer")))
    assert json.loads(out)["zero_optimization"] == {"stage": 3, "overlap_comm": False}
    assert '    "stage": 3,\n    "overlap_comm": false\n' in out
    d = doc(tmp_path, "ds.json", JSON)
    out = apply(d, delete_member(d, d.get("zero_optimization.overlap_comm")))
    assert json.loads(out)["zero_optimization"] == {"stage": 3, "stage3_offload_optimizer": True}
    d = doc(tmp_path, "ds.json", JSON)
    out = apply(d, delete_member(d, d.get("train_batch_size")))
    assert list(json.loads(out)) == ["gradient_accumulation_steps", "zero_optimization"]
    assert out.startswith('{\n  "gradient_accumulation_steps"')


def test_yaml_edits_keep_comments(tmp_path):
    d = doc(tmp_path, "t.yaml", YAML)
    out = apply(d, delete_member(d, d.get("sharded_ddp")), rename_key(d, d.get("bf16"), "fp16"),
                replace_value(d, d.get("per_device_train_batch_size"), 2))
    assert out == "### train\nper_device_train_batch_size: 2   # keep me\ngradient_accumulation_steps: 16\nfp16: true\n"
    assert yaml.safe_load(out)["fp16"] is True


def test_unchanged_file_is_not_touched_and_mode_kept(tmp_path):
    d = doc(tmp_path, "ds.json", JSON)
    os.chmod(d.path, 0o640)
    before = d.path.stat().st_mtime_ns
    same = replace_value(d, d.get("zero_optimization.stage"), 3)
    changes = planned([same], {d.path: d.text})
    assert changes == {} and apply_edits(changes) == [] and d.path.stat().st_mtime_ns == before
    apply(d, replace_value(d, d.get("zero_optimization.stage"), 2))
    assert stat.S_IMODE(d.path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["ds.json"]  # no temporary file left


def test_diff_shows_change(tmp_path):
    d = doc(tmp_path, "ds.json", JSON)
    text = diff(planned([replace_value(d, d.get("zero_optimization.stage"), 2)], {d.path: d.text}))
    assert '-    "stage": 3,' in text and '+    "stage": 2,' in text
