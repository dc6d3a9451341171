"""Open a page in a real headless Chromium and report what a person would see, over the DevTools protocol.

Debian's ``chromium`` is driven through ``--remote-debugging-pipe`` (fd 3 in, fd 4 out, messages
ended by NUL): no websocket client, no Playwright (whose pinned browser builds cannot be fetched
here and whose driver is ~100 MB), only Chromium's own protocol. The browser runs in its own
process group with a fresh profile, and the group is killed on every path.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-pipe")


def chromium() -> Optional[str]:
    """The Chromium executable (Debian's ``chromium``), or None."""
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageVisit:
    """What happened while the page loaded."""

    console_errors: List[str] = field(default_factory=list)
    requests: List[str] = field(default_factory=list)
    facts: Any = None
    screenshot: Optional[bytes] = None


class _Pipe:
    """The two ends of Chromium's debugging pipe, with a deadline on every read."""

    def __init__(self, to_browser: int, from_browser: int, deadline: float) -> None:
        self.w, self.r, self.deadline = to_browser, from_browser, deadline
        self.buf = b""
        self.next_id = 0
        self.events: List[Dict[str, Any]] = []

    def send(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> int:
        self.next_id += 1
        msg: Dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self.w, data):]
        return self.next_id

    def _read_one(self) -> Dict[str, Any]:
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise ConnectionError("Chromium closed its debugging pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: Optional[dict] = None, session: Optional[str] = None) -> Dict[str, Any]:
        """Send a command and return its result; events that arrive meanwhile are kept."""
        want = self.send(method, params, session)
        while True:
            msg = self._read_one()
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str) -> Dict[str, Any]:
        for i, e in enumerate(self.events):
            if e["method"] == method:
                return self.events.pop(i)
        while True:
            msg = self._read_one()
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)


def _spawn(exe: str, profile: str, to_child: int, from_child: int) -> int:
    """Start Chromium in a new session (its own process group) with the pipe on fds 3 and 4."""
    # copies above 10 first, so that dup2 onto 3 and 4 never overwrites a source (and clears close-on-exec)
    devnull = os.open(os.devnull, os.O_RDWR)
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (devnull, to_child, from_child)]
    os.close(devnull)
    actions = [(os.POSIX_SPAWN_DUP2, high[0], 0), (os.POSIX_SPAWN_DUP2, high[0], 1),
               (os.POSIX_SPAWN_DUP2, high[0], 2), (os.POSIX_SPAWN_DUP2, high[1], 3),
               (os.POSIX_SPAWN_DUP2, high[2], 4)]
    try:
        return os.posix_spawn(exe, [exe, *FLAGS, f"--user-data-dir={profile}", "about:blank"], dict(os.environ),
                              file_actions=actions, setsid=True)
    finally:
        for fd in high:
            os.close(fd)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _collect(pipe: _Pipe, visit: PageVisit) -> None:
    """Console errors, uncaught exceptions and network requests from the events seen so far."""
    for e in pipe.events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            visit.console_errors.append(json.dumps(p.get("exceptionDetails", {}))[:500])
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            visit.console_errors.append(json.dumps(p.get("args", []))[:500])
        elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            visit.console_errors.append(p["entry"].get("text", "")[:500])
        elif e["method"] == "Network.requestWillBeSent":
            visit.requests.append(p.get("request", {}).get("url", ""))
    pipe.events.clear()


class Browser:
    """One headless Chromium for several pages; ``with Browser() as b: b.visit(page, script)``."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout  # seconds for the start and for each page, every read included
        self.pid: Optional[int] = None

    def __enter__(self) -> "Browser":
        exe = chromium()
        if exe is None:
            raise FileNotFoundError("chromium is not installed (apt-get install chromium)")
        to_child, self._to_browser = os.pipe()
        self._from_browser, from_child = os.pipe()
        self.profile = tempfile.mkdtemp(prefix="zp-chromium-")
        try:
            self.pid = _spawn(exe, self.profile, to_child, from_child)
        finally:
            os.close(to_child)
            os.close(from_child)
        self.pipe = _Pipe(self._to_browser, self._from_browser, time.monotonic() + self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            _kill(self.pid)
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)

    def visit(self, page: Path, script: str, screenshot: bool = True, width: int = 1280) -> PageVisit:
        """Load ``page`` (a local file) in a new tab, evaluate ``script`` (an expression), take a full-page PNG."""
        pipe, result = self.pipe, PageVisit()
        pipe.deadline = time.monotonic() + self.timeout  # each page gets the whole timeout
        pipe.events.clear()
        target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            pipe.call(f"{domain}.enable", session=session)
        pipe.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        pipe.call("Page.navigate", {"url": Path(page).resolve().as_uri()}, session=session)
        pipe.wait_event("Page.loadEventFired")
        value = pipe.call("Runtime.evaluate", {"expression": script, "returnByValue": True}, session=session)
        result.facts = value.get("result", {}).get("value")
        if screenshot:
            size = pipe.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
            shot = pipe.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
                "x": 0, "y": 0, "width": width, "height": min(size["height"], 16000), "scale": 1}}, session=session)
            result.screenshot = base64.b64decode(shot["data"])
        _collect(pipe, result)
        pipe.call("Target.closeTarget", {"targetId": target})
        return result


def visit(page: Path, script: str, screenshot: bool = True, width: int = 1280, timeout: float = 60.0) -> PageVisit:
    """Open one page in a browser of its own."""
    with Browser(timeout) as browser:
        return browser.visit(page, script, screenshot, width)
