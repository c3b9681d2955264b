"""A page opened in headless Chromium, driven over the DevTools protocol, for the browser tests.

Chromium speaks the protocol over a pipe (`--remote-debugging-pipe`: it reads commands on fd 3 and
writes replies and events on fd 4, each message JSON ended by a NUL byte), so no websocket library and
no port are needed. The distribution's `chromium` runs as root only without its sandbox, and the
background-networking flags keep it from dialling out (this project's CI has no network). Importable
from every test folder (pytest's pythonpath includes tests/).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-pipe", "--window-size=1400,1000"]


def chromium() -> str:
    """The Chromium binary; the tests need it (.ci/run installs the distribution's package)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found is not None, "the browser tests need chromium: apt-get install -y chromium (.ci/run does)"
    return found


class Page:
    """One tab of a fresh headless Chromium, with every console error, exception and request recorded."""

    def __init__(self) -> None:
        self._profile = tempfile.mkdtemp(prefix="zbsearch-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:
            # The protocol's fixed descriptors in the child. Moved up first: a pipe may already sit on 3
            # or 4, and dup2 onto itself would keep its close-on-exec flag.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        # close_fds would close 3 and 4 after fds() ran; Python's own descriptors close on exec anyway.
        self._proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
                                      preexec_fn=fds, close_fds=False,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=True)

    def _read(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            assert time.monotonic() < deadline, "chromium did not answer in time"
            chunk = os.read(self._from_browser, 1 << 16)
            assert chunk, "chromium closed its pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False,
             timeout: float = 20.0) -> dict[str, Any]:
        """Send one command and wait for its reply, keeping the events that arrive meanwhile."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self._next:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, path: Path) -> None:
        """Load a file and wait until its script says the page is drawn."""
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=True)
        deadline = time.monotonic() + 20
        # Until the navigation commits, the old document (or none) answers.
        ready = "document.location.href === %s && document.documentElement?.getAttribute('data-ready')"
        while self.evaluate(ready % json.dumps(path.resolve().as_uri())) != "1":
            assert time.monotonic() < deadline, "the page never became ready (see console_errors)"
            time.sleep(0.05)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def mouse_move(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, session=True)

    def screenshot(self, whole: bool = False) -> bytes:
        """A PNG of the viewport, or with `whole` of the whole page."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": whole}
        return base64.b64decode(self.call("Page.captureScreenshot", params, session=True)["data"])

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries, as text."""
        out = []
        for e in self.events:
            params = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif e.get("method") == "Runtime.exceptionThrown":
                out.append(str(params.get("exceptionDetails")))
            elif e.get("method") == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(params["entry"].get("text", ""))
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except AssertionError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
