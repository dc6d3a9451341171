"""The hostile-checkpoint harness: real DeepSpeed checkpoints, damaged or crafted, and the promise checked.

Every case runs ``zeropilot ckpt ...`` in a child process of its own (own process group, killed on every
path) and checks the promise of ``docs/ckpt.md`` (threat model):

* no hang: the harness kills the child after ``TIMEOUT`` seconds and the case fails (no timed assertion);
* memory bounded: the child's peak RSS, measured by ``os.wait4`` for that child alone, stays under
  ``RSS_LIMIT`` (an RLIMIT_AS of 8 GiB is only a safety net for the machine);
* one line on stderr and exit 2 (bad input), or a DAMAGED verdict and exit 1; never a traceback;
* no marker file (nothing executed), no byte of the planted secret in stdout, stderr or any file
  written, nothing at OUT.

The checkpoints are those of ``tests/checkpoint/conftest.py`` (built once per session, shared).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import pytest

from tests.checkpoint.conftest import checkpoints  # noqa: F401 - the session fixture

TIMEOUT = 60  # seconds before a child counts as hung (tiny checkpoints take well under 2 s)
RSS_LIMIT = 320 << 20  # bytes; measured: export without torch 33 MB, with torch (a cast, verify) 225 MB
SECRET = b"ZP-SECRET-7f3a9c1e5b2d4f60-DO-NOT-COPY"
Z2, Z3 = "z2_w2_bf16_tied", "z3_w2_bf16_tied"


@dataclass
class Ran:
    """What one CLI child did."""

    rc: int
    stdout: str
    stderr: str
    peak_rss: int  # bytes


# A small Python that forks the measured command and reports its exit status and peak RSS: the child's
# ru_maxrss counts the pages of whatever process forked it, so the fork must come from a small process,
# not from pytest (which may hold torch, hundreds of MB).
_MEASURE = (
    "import json, os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable] + sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "code = os.waitstatus_to_exitcode(status)\n"
    "open(sys.argv[1], 'w').write(json.dumps([code, usage.ru_maxrss]))\n")


def run_cli(*args, cwd: Optional[Path] = None, python_code: Optional[str] = None) -> Ran:
    """Run ``python -m zeropilot ARGS`` (or `python_code`) in its own process group, measured and bounded."""
    import json
    import tempfile

    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONDONTWRITEBYTECODE="1")
    env.pop("ZEROPILOT_DEBUG", None)
    child = ["-c", python_code, *map(str, args)] if python_code else ["-m", "zeropilot", *map(str, args)]
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "rss.json"
        with open(Path(scratch) / "out", "w+b") as fout, open(Path(scratch) / "err", "w+b") as ferr:
            proc = subprocess.Popen([sys.executable, "-c", _MEASURE, str(report), *child], stdout=fout,
                                    stderr=ferr, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                    start_new_session=True, preexec_fn=_limits)
            status = None
            try:
                status, _usage = _wait(proc.pid, TIMEOUT)
            finally:
                _kill_group(proc.pid, reaped=status is not None)
            proc.returncode = -9 if status is None else status
            assert status is not None, f"hung: killed after {TIMEOUT} s: {' '.join(map(str, args))}"
            fout.seek(0)
            ferr.seek(0)
            stdout, stderr = fout.read(), ferr.read()
        code, maxrss_kb = json.loads(report.read_text())
    return Ran(code, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"), maxrss_kb * 1024)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def _wait(pid: int, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return (os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode")
                    else status >> 8), usage
        time.sleep(0.02)
    return None, None


def _kill_group(pid: int, reaped: bool) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the child's group: anything it started dies with it
    except (ProcessLookupError, PermissionError):
        pass
    if not reaped:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


# ---- the promise ------------------------------------------------------------------------------------


def assert_promise(ran: Ran, *, code, out: Optional[Path] = None, tmp: Optional[Path] = None,
                   marker: Optional[Path] = None, rss: int = RSS_LIMIT) -> None:
    """The promise for one refused case: `code` 2 = one line on stderr, 1 = a DAMAGED verdict."""
    text = ran.stdout + ran.stderr
    assert "Traceback" not in text, text[-3000:]
    assert ran.rc == code, f"exit {ran.rc}, expected {code}:\n{text[-3000:]}"
    if code == 2:
        lines = [ln for ln in ran.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("zeropilot: error: "), ran.stderr[-3000:]
    else:
        assert "verdict: DAMAGED" in text, text[-3000:]
    assert "\x1b" not in text and "\x07" not in text, "unsanitised control characters printed"
    assert ran.peak_rss < rss, f"peak RSS {ran.peak_rss >> 20} MiB >= {rss >> 20} MiB"
    assert SECRET not in text.encode(), "the secret was printed"
    if out is not None:
        assert not os.path.lexists(out), f"{out} was written"
        leftovers = [p for p in out.parent.iterdir() if p.name.startswith(".zeropilot-")]
        assert not leftovers, leftovers
    if tmp is not None:
        assert_no_secret_written(tmp)
    if marker is not None:
        assert not marker.exists(), "the marker file exists: code from the checkpoint ran"


def assert_no_secret_written(root: Path, skip: Iterable[Path] = ()) -> None:
    """No file under `root` (outside the planted secret itself) holds the secret's bytes."""
    skip = {Path(p).resolve() for p in skip}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file() or p.resolve() in skip or p.name == "secret.txt":
                continue
            if p.stat().st_blocks * 512 < min(p.stat().st_size, 1 << 20):
                continue  # a sparse file a case planted (holes read as zeros)
            with open(p, "rb") as f:
                tail = b""
                for chunk in iter(lambda: f.read(8 << 20), b""):
                    assert SECRET not in tail + chunk, f"secret bytes in {p}"
                    tail = chunk[-len(SECRET):]


# ---- fixtures and builders --------------------------------------------------------------------------


@pytest.fixture
def case(tmp_path, checkpoints):  # noqa: F811
    """``case(name)`` -> a private copy of the checkpoint `name`, a planted secret, a marker path and OUT."""

    def make(name: str = Z2) -> "Case":
        root = checkpoints(name).copy(tmp_path / "ckpt")
        secret = tmp_path / "secret.txt"
        secret.write_bytes(SECRET * 64)
        return Case(root=root, tmp=tmp_path, secret=secret, marker=tmp_path / "pwned", out=tmp_path / "out")

    return make


@dataclass
class Case:
    root: Path  # the save dir (with `latest`)
    tmp: Path
    secret: Path
    marker: Path
    out: Path

    @property
    def tag_dir(self) -> Path:
        return self.root / "global_step2"

    def file(self, pattern: str) -> Path:
        found = sorted(self.tag_dir.glob(pattern))
        assert found, pattern
        return found[0]

    def export(self, *extra) -> Ran:
        return run_cli("ckpt", "export", self.root, self.out, "--no-progress", *extra)

    def check(self, ran: Ran, code: int, **kw) -> None:
        assert_promise(ran, code=code, out=self.out, tmp=self.tmp, marker=self.marker, **kw)


def rewrite_archive(path: Path, replace: dict = None, extra: Iterable = (), method: dict = None) -> None:
    """Rewrite the torch zip archive `path`: records renamed by suffix in `replace` get new bytes,
    `extra` (name suffix, bytes) records are appended, `method` sets a record's compression."""
    replace, method = replace or {}, method or {}
    with zipfile.ZipFile(path) as zf:
        items = [(i.filename, zf.read(i)) for i in zf.infolist()]
    prefix = items[0][0].split("/")[0] + "/"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in items:
            short = name[len(prefix):]
            zf.writestr(zipfile.ZipInfo(name), replace.get(short, data), compress_type=method.get(short,
                                                                                               zipfile.ZIP_STORED))
        for short, data in extra:
            zf.writestr(zipfile.ZipInfo(prefix + short), data)


def resave(path: Path, edit) -> None:
    """Load `path` with torch (we built it: trusted), apply `edit(obj)` and save it back with torch."""
    import torch

    obj = torch.load(str(path), weights_only=False)
    obj = edit(obj) or obj
    torch.save(obj, str(path))


def pretty(ran: Ran) -> str:
    return f"rc={ran.rc} rss={ran.peak_rss >> 20}MiB\n{ran.stdout[-1500:]}\n{ran.stderr[-1500:]}"


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest
