"""FIFOs, devices, sockets and folders where a file is expected, for every command: one line and exit 2 (or a
note in a report), never a wait.

Every case runs ``zeropilot.cli.main`` in one child process (one start-up for all of them, run in turn, each
announced before it starts); the child is killed after :data:`TIMEOUT` seconds and a case that did not finish
is named as the one that waited. Readers open input through :mod:`zeropilot.safefile`: a FIFO without a writer
would block ``open()`` forever, ``/dev/zero`` would never end a read, a socket cannot be opened, and an output
renamed over ``/dev/null`` by a root user would replace the device. Outputs are tested on a FIFO, a socket, a
symlink to ``/dev/null`` and (as root) a device node made in the test's own folder, never on ``/dev`` itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.checkpoint.conftest import checkpoints  # noqa: F401 - the session fixture

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "tests" / "data" / "checkpoints" / "ds0.14.4_z2_w2_bf16" / "run"
SEED = REPO / "examples" / "seed"
TIMEOUT = 120  # seconds for every case together (they take about 10 s); a hung read would never end

_CHILD = r"""
import contextlib, io, json, sys, traceback
from zeropilot.cli import main
for case in json.loads(sys.argv[1]):
    print(json.dumps({"start": case["id"]}), flush=True)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(case["argv"]) if "argv" in case else exec(case["code"])
        except SystemExit as exc:
            rc = exc.code
        except BaseException:
            rc, err = "traceback", io.StringIO(traceback.format_exc())
    print(json.dumps({"id": case["id"], "rc": rc, "out": out.getvalue(), "err": err.getvalue()}), flush=True)
"""


@pytest.fixture
def specials(tmp_path):
    """kind -> a path of that kind: inputs read (the real /dev/zero and /dev/null) and outputs (made here)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "devnull-link").symlink_to("/dev/null")
    paths = {"fifo": fifo, "socket": tmp_path / "sock", "dev-zero": Path("/dev/zero"), "dev-null": Path("/dev/null")}
    outputs = {"fifo": fifo, "socket": tmp_path / "sock", "link-to-dev-null": tmp_path / "devnull-link"}
    if os.geteuid() == 0:  # a device node of our own (the null device's numbers): replacing it harms nothing
        os.mknod(tmp_path / "null-node", 0o666 | 0o020000, os.makedev(1, 3))
        outputs["device-node"] = tmp_path / "null-node"
    yield paths, outputs
    sock.close()


def _run_cases(cases: List[dict]) -> Dict[str, dict]:
    """Run every case in one child; the case that was running when the child was killed is named."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), DS_ACCELERATOR="cpu", ZEROPILOT_OFFLINE="1",
               HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("ZEROPILOT_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cases)], cwd=str(REPO), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    done = {r["id"]: r for r in lines if "rc" in r}
    started = [r["start"] for r in lines if "start" in r]
    hung = [s for s in started if s not in done]
    assert not hung, f"waited (killed after {TIMEOUT} s): {hung[0]}\n{err[-2000:]}"
    assert len(done) == len(cases), f"the child died: {err[-3000:]}"
    return done


def _one_line_exit_2(result: dict) -> str:
    assert result["rc"] == 2, result
    lines = [ln for ln in result["err"].splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("zeropilot: error: "), result
    return lines[0]


def _run_dir(root: Path) -> Path:
    """A small run directory as `zeropilot run` writes it (run.json and one rank's records)."""
    root.mkdir()
    (root / "run.json").write_text(json.dumps({"schema": "zeropilot.run/1", "command": ["python", "train.py"],
                                               "started_at": 1.0, "ended_at": 3.0, "exit_code": 0}))
    (root / "rank-0.jsonl").write_text("".join(json.dumps({"event": "step", "t": 1.0 + i, "step": i + 1,
                                                           "seconds": 0.5, "mem": {}}) + "\n" for i in range(3)))
    return root


def _export_like(folder: Path) -> Path:
    """A folder with a valid (tiny) model.safetensors, so that `ckpt verify` goes on to read --against."""
    folder.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    return folder


def test_every_command_refuses_special_files_without_waiting(tmp_path, specials):
    paths, outputs = specials
    run = _run_dir(tmp_path / "run")
    launch = tmp_path / "launch"
    shutil.copytree(SEED, launch)
    model = ["--model", "qwen2.5-0.5b"]
    inputs = {  # command -> argv with X where the special path goes; every one must be refused in one line
        "check --hardware": ["check", str(launch), "--gpus", "none", "--hardware", "X"],
        "plan LAUNCH": ["plan", "X", *model, "--gpus", "1x80GiB"],
        "plan --model": ["plan", "--model", "X", "--gpus", "1x80GiB"],
        "plan --hardware": ["plan", *model, "--hardware", "X"],
        "repro LAUNCH": ["repro", "X", "--cpu", "--nproc", "1", *model, "--out", str(tmp_path / "r")],
        "repro --model": ["repro", str(launch), "--cpu", "--nproc", "1", "--model", "X", "--out", str(tmp_path / "r")],
        "report": ["report", "X"],
        "report --compare": ["report", str(run), "--compare", "X"],
        "top": ["top", "X", "--once"],
        "top --format json": ["top", "X", "--format", "json"],
        "ckpt inspect": ["ckpt", "inspect", "X"],
        "ckpt export": ["ckpt", "export", "X", str(tmp_path / "never")],
        "ckpt universal": ["ckpt", "universal", "X", str(tmp_path / "never"), "--no-progress"],
        "ckpt verify": ["ckpt", "verify", "X", "--against", str(CKPT)],
        "ckpt verify --against": ["ckpt", "verify", str(_export_like(tmp_path / "export")), "--against", "X"],
        "calibrate --checkpoint-dir": ["calibrate", "--checkpoint-dir", "X", "--out", str(tmp_path / "p.json")],
        "explain": ["explain", "X"],
        "rules --select": ["rules", "--select", "X"],
        "run --timeouts-from": ["run", "--out", str(tmp_path / "never"), "--timeouts-from", "X", "--",
                                sys.executable, "-c", "pass"],
    }
    outs = {
        "report --out": ["report", str(run), "--out", "X"],
        "plan --write-ds-config": ["plan", *model, "--gpus", "1x80GiB", "--search", "--write-ds-config", "X"],
        "ckpt export OUT --force": ["ckpt", "export", str(CKPT), "X", "--force", "--no-progress"],
        "ckpt universal OUT --force": ["ckpt", "universal", str(CKPT), "X", "--force", "--no-progress"],
        "calibrate --out": ["calibrate", "--out", "X", "--checkpoint-dir", str(tmp_path)],
        "run --out": ["run", "--out", "X", "--", sys.executable, "-c", "pass"],
        "repro --out": ["repro", str(launch), "--cpu", "--nproc", "1", *model, "--out", "X"],
    }
    cases = [{"id": f"{name} [{kind}]", "argv": [str(path) if a == "X" else a for a in argv]}
             for table, kinds in ((inputs, paths), (outs, outputs)) for name, argv in table.items()
             for kind, path in kinds.items()]
    before = {k: (os.lstat(p).st_mode, os.lstat(p).st_rdev) for k, p in {**paths, **outputs}.items()}
    results = _run_cases(cases)
    for case in cases:
        _one_line_exit_2(results[case["id"]])
    # nothing special was replaced, written to or removed
    assert before == {k: (os.lstat(p).st_mode, os.lstat(p).st_rdev) for k, p in {**paths, **outputs}.items()}
    assert not (tmp_path / "never").exists() and not (tmp_path / "r").exists()
    reasons = {c["id"]: results[c["id"]]["err"] for c in cases}
    assert "a FIFO, not a regular file" in reasons["plan --hardware [fifo]"]
    assert "a device, not a regular file" in reasons["plan --model [dev-zero]"]
    assert "a socket, not a regular file" in reasons["plan LAUNCH [socket]"]
    assert "refused as an output" in reasons["report --out [link-to-dev-null]"]
    assert "a FIFO: refused as an output" in reasons["run --out [fifo]"]
    assert "not a directory" in reasons["ckpt inspect [fifo]"] and "not a folder" in reasons["report [socket]"]
    assert "not a directory" in reasons["ckpt verify --against [dev-null]"]
    assert "not a directory" in reasons["ckpt universal [fifo]"]
    assert "a socket: refused as an output" in reasons["ckpt universal OUT --force [socket]"]


@pytest.mark.slow
def test_merge_into_a_base_folder_holding_a_fifo(tmp_path, checkpoints):  # noqa: F811 - the session fixture
    """The base model's ``model.safetensors`` is a FIFO: refused before safetensors opens it (which would wait)."""
    built = checkpoints("z3_w2_fp32_lora_excl")
    base = tmp_path / "base"
    base.mkdir()
    os.mkfifo(base / "model.safetensors")
    result = _run_cases([{"id": "merge", "argv": ["ckpt", "export", str(built.path), str(tmp_path / "out"),
                                                  "--merge-into", str(base), "--no-progress"]}])["merge"]
    assert "a FIFO, not a regular file" in _one_line_exit_2(result)
    assert not (tmp_path / "out").exists()


def test_check_reports_a_special_file_in_a_launch_folder_and_exits_2(tmp_path, specials):
    """A FIFO (or a socket, or a link to /dev/zero) named accelerate.yaml beside the seed launch: the rest of the
    launch is still checked, the file is one read error, exit 2."""
    paths, _ = specials
    cases = []
    for kind, path in paths.items():
        folder = tmp_path / f"launch-{kind}"
        shutil.copytree(SEED, folder)
        target = folder / "accelerate.yaml"
        if kind == "fifo":
            os.mkfifo(target)
        else:
            target.symlink_to(path)
        cases.append({"id": kind, "argv": ["check", str(folder), "--gpus", "none", "--format", "json"]})
    cases.append({"id": "all at once", "argv": ["check", *[str(p) for p in paths.values()], "--gpus", "none"]})
    results = _run_cases(cases)
    for kind in paths:
        doc = json.loads(results[kind]["out"])
        assert results[kind]["rc"] == 2
        errors = [e for e in doc["read_errors"] if e["file"].endswith("accelerate.yaml")]
        assert len(errors) == 1 and "not a regular file: refused" in errors[0]["message"], doc["read_errors"]
        assert {f["code"] for f in doc["findings"]} >= {"HF001", "HF003"}  # the seed's own errors still found
    together = results["all at once"]
    assert together["rc"] == 2 and together["out"].count("not a regular file: refused") == len(paths)


def test_a_report_notes_special_files_in_the_run_directory(tmp_path, specials):
    paths, _ = specials
    run = _run_dir(tmp_path / "run")
    os.mkfifo(run / "rank-1.jsonl")
    (run / "hang.json").symlink_to(paths["dev-zero"])
    (run / "oom-rank-0.json").symlink_to(paths["socket"])
    result = _run_cases([{"id": "report", "argv": ["report", str(run), "--format", "json"]}])["report"]
    assert result["rc"] == 0, result
    problems = json.loads(result["out"])["problems"]
    assert "rank-1.jsonl: not a regular file, not read" in problems
    assert {"hang.json: a symbolic link, not read", "oom-rank-0.json: a symbolic link, not read"} <= set(problems)


def test_the_harness_names_the_case_that_waits(tmp_path, monkeypatch):
    """The witness that a wait is caught: reading a FIFO with plain open() is killed and named."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setattr(sys.modules[__name__], "TIMEOUT", 3)
    with pytest.raises(AssertionError, match="waited .*: plain open"):
        _run_cases([{"id": "plain open", "code": f"open({str(fifo)!r}).read()"}])
