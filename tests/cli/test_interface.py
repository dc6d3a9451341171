"""check's interface (issue 13): ruff-grade selection, [tool.zeropilot], inline suppressions, warnings,
versioned JSON, and no hidden I/O (nvidia-smi and the Hub only from the CLI / when asked)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import write_files
from zeropilot.check import check
from zeropilot.cli import main
from zeropilot.errors import InputError

BOTH = {"fp16": {"enabled": True}, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
V = ["--versions", "deepspeed=0.19.8,transformers=5.24.0,accelerate=1.15.0"]


def codes_of(capsys, *argv):
    code = main(["check", *map(str, argv), "--format", "json", *V])
    out = json.loads(capsys.readouterr().out)
    return code, sorted({f["code"] for f in out["findings"]}), out


# --- selection -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, value, hint", [("--select", "ZZ999", "unknown rule selector 'ZZ999'"),
                                              ("--ignore", "DS0O5", "DS005 or"),
                                              ("--select", "fp16-and-bf16-both-enable", "did you mean fp16-and-")])
def test_unknown_selector_is_exit_2_with_a_suggestion(tmp_path, capsys, flag, value, hint):
    root = write_files(tmp_path, {"ds.json": BOTH})
    assert main(["check", str(root), flag, value]) == 2
    assert hint in capsys.readouterr().err


def test_prefixes_names_and_specificity(tmp_path, capsys):
    root = write_files(tmp_path, {"ds.json": BOTH})
    _, found, _ = codes_of(capsys, root, "--select", "DS")
    assert "DS005" in found and all(c.startswith("DS") for c in found)
    assert codes_of(capsys, root, "--select", "fp16-and-bf16-both-enabled")[1] == ["DS005"]
    assert codes_of(capsys, root, "--select", "DS005", "--ignore", "DS")[1] == ["DS005"]  # more specific wins
    assert "DS005" not in codes_of(capsys, root, "--select", "DS", "--ignore", "DS005")[1]
    assert "DS005" not in codes_of(capsys, root, "--select", "DS00", "--ignore", "DS00")[1]  # tie: ignore


def test_rules_json_is_versioned_and_selectable(capsys):
    assert main(["rules", "--format", "json", "--select", "DS00"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "zeropilot.rules/1" and out["tool"]["name"] == "zeropilot"
    assert out["rules"] and all(r["code"].startswith("DS00") for r in out["rules"])


def test_check_json_is_versioned(tmp_path, capsys):
    code, _, out = codes_of(capsys, write_files(tmp_path, {"ds.json": BOTH}))
    assert code == 1 and out["schema"] == "zeropilot.check/1"
    assert {"findings", "summary", "files", "read_errors", "skipped", "notices", "versions",
            "world_size"} <= set(out)


# --- [tool.zeropilot] -------------------------------------------------------------------------------------

def test_settings_found_from_the_checked_path_upward(tmp_path, capsys):
    write_files(tmp_path, {"pyproject.toml": '[tool.zeropilot]\nignore = ["DS005"]\nfail-on = "warning"\n',
                           "a/pyproject.toml": "[project]\nname = 'x'\n",  # no [tool.zeropilot]: passed over
                           "a/b/ds.json": BOTH})
    code, found, _ = codes_of(capsys, tmp_path / "a" / "b")
    assert "DS005" not in found
    assert "DS005" in codes_of(capsys, tmp_path / "a" / "b", "--isolated")[1]


def test_settings_select_versions_and_per_file_ignores(tmp_path, capsys):
    write_files(tmp_path, {"pyproject.toml": '[tool.zeropilot]\nselect = ["DS005", "DS001"]\n'
                                             'versions = { deepspeed = "0.19.8" }\n'
                                             'per-file-ignores = { "legacy/*.json" = ["DS005"] }\n',
                           "legacy/ds.json": BOTH, "new/ds.json": BOTH})
    result_legacy = codes_of(capsys, tmp_path / "legacy")
    assert result_legacy[1] == [] and result_legacy[2]["summary"]["suppressed"] == 1
    _, found, out = codes_of(capsys, tmp_path / "new")
    assert found == ["DS005"] and out["findings"][0]["versions"] == {"deepspeed": "0.19.8"}


@pytest.mark.parametrize("toml, message", [('[tool.zeropilot]\nignor = ["DS005"]\n', "did you mean ignore"),
                                           ('[tool.zeropilot]\nselect = ["QQ1"]\n', "unknown rule selector"),
                                           ('[tool.zeropilot]\nworld-size = "8"\n', "positive integer"),
                                           ('[tool.zeropilot\n', "not valid TOML")])
def test_bad_settings_are_exit_2(tmp_path, capsys, toml, message):
    write_files(tmp_path, {"pyproject.toml": toml, "ds.json": BOTH})
    assert main(["check", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


# --- inline suppressions ----------------------------------------------------------------------------------

DS_TEXT = """{
  "fp16": {"enabled": true},
  "bf16": {
    "enabled": true  // zeropilot: ignore[DS005]
  },
  "zero_optimization": {"stage": 2}
}
"""


def test_suppression_in_deepspeed_json_with_comments(tmp_path, capsys):
    write_files(tmp_path, {"ds.json": DS_TEXT, "run.sh": "deepspeed train.py --deepspeed_config ds.json\n"})
    code, found, out = codes_of(capsys, tmp_path, "--select", "DS005")
    assert (code, found, out["summary"]["suppressed"]) == (0, [], 1)
    write_files(tmp_path, {"ds.json": DS_TEXT.replace("// zeropilot: ignore[DS005]", "")})
    assert codes_of(capsys, tmp_path, "--select", "DS005")[1] == ["DS005"]


def test_suppression_in_yaml_and_shell_by_line_next_line_and_file(tmp_path, capsys):
    write_files(tmp_path, {"run.sh": "pkill -9 python  # zeropilot: ignore[SH001]\n"})
    assert codes_of(capsys, tmp_path, "--select", "SH001")[1] == []
    write_files(tmp_path, {"run.sh": "# zeropilot: ignore[destructive-kill-in-launch-script]\npkill -9 python\n"})
    assert codes_of(capsys, tmp_path, "--select", "SH001")[1] == []
    write_files(tmp_path, {"run.sh": "pkill -9 python\n# zeropilot: ignore-file[SH]\n"})
    assert codes_of(capsys, tmp_path, "--select", "SH001")[1] == []
    write_files(tmp_path, {"run.sh": "pkill -9 python  # zeropilot: ignore[SH002]\n"})
    assert codes_of(capsys, tmp_path, "--select", "SH001")[1] == ["SH001"]


def test_suppression_naming_no_rule_is_a_warning(tmp_path, capsys):
    write_files(tmp_path, {"run.sh": "pkill -9 python  # zeropilot: ignore[SH9999]\n"})
    main(["check", str(tmp_path)])
    assert "suppression names no rule: 'SH9999'" in capsys.readouterr().err


# --- warnings and plan ------------------------------------------------------------------------------------

def test_no_launch_file_is_a_warning(tmp_path, capsys):
    write_files(tmp_path, {"notes.txt": "hello", "tokenizer.json": {"model": {}}})
    assert main(["check", str(tmp_path)]) == 0
    assert "warning: no launch file found" in capsys.readouterr().err


def test_plan_refuses_an_unreadable_launch_file_like_check(tmp_path, capsys):
    write_files(tmp_path, {"ds.json": '{"zero_optimization": {"stage": 3},,}'})
    assert main(["check", str(tmp_path)]) == 2
    assert main(["plan", str(tmp_path), "--model", "qwen2.5-0.5b", "--gpus", "1x80GiB"]) == 2
    assert "ds.json:1" in capsys.readouterr().err


# --- no hidden I/O ----------------------------------------------------------------------------------------

def test_library_never_runs_nvidia_smi_the_cli_does_and_says_so(tmp_path, monkeypatch, capsys):
    bin_dir, marker = tmp_path / "bin", tmp_path / "called"
    write_files(bin_dir, {"nvidia-smi": f"#!/bin/sh\necho x >> {marker}\necho 81559\necho 81559\n"})
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    root = write_files(tmp_path / "l", {"ds.json": BOTH})
    result, launch = check([root], use_installed=False)
    assert not marker.exists() and launch.gpus is None
    main(["check", str(root), *V])
    calls = marker.read_text()
    assert calls.startswith("x\n")  # the command asks (the card size, and the model for its calibrate profile)
    assert "memory rules use this machine's GPUs: 2x81559MiB (nvidia-smi)" in capsys.readouterr().err
    main(["check", str(root), "--gpus", "none", *V])
    assert marker.read_text() == calls


TINY = {"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "vocab_size": 10}


@pytest.fixture
def hub_server():
    """A Hub stand-in on 127.0.0.1 that serves one config and records each request's path and token."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            ok = self.path == "/acme/tiny/resolve/main/config.json"
            body = json.dumps(TINY).encode() if ok else b"{}"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_hub_only_when_asked_honouring_endpoint_token_and_offline(tmp_path, monkeypatch, capsys, hub_server):
    url, seen = hub_server
    for var in ("HF_HUB_OFFLINE", "ZEROPILOT_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", url)
    root = write_files(tmp_path / "l", {
        "ds.json": {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"},
        "train.yaml": "model_name_or_path: acme/tiny\ndeepspeed: ds.json\noutput_dir: out\n"
                      "per_device_train_batch_size: 1\n",
        "run.sh": "torchrun --nproc_per_node 2 train.py train.yaml\n"})
    result, _ = check([root], gpus="2x80GiB", select=["MEM"], use_installed=False)
    assert seen == [] and [f.severity.value for f in result.findings] == ["info"]
    assert "--hub" in result.findings[0].message or "--model" in result.findings[0].message
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert main(["check", str(root), "--gpus", "2x80GiB", "--select", "MEM", "--hub", *V]) == 0
    assert seen == [("/acme/tiny/resolve/main/config.json", "Bearer hf_test")]  # one request for two rules
    assert f"read from the Hub: {url} with HF_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    main(["check", str(root), "--gpus", "2x80GiB", "--select", "MEM", "--hub", *V])
    assert len(seen) == 1


def test_library_selection_errors_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="unknown rule selector"):
        check([write_files(tmp_path, {"ds.json": BOTH})], select=["NOPE1"], use_installed=False)
    with pytest.raises(InputError, match="unknown rule selector"):
        check([tmp_path], per_file_ignores={"*.json": ["NOPE1"]}, use_installed=False)
