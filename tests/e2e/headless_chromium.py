"""Headless Chromium (Debian's ``chromium``), driven over the DevTools protocol: open a page, evaluate an
expression in it, take a screenshot. The protocol's WebSocket is spoken with ``websocket-client`` (a
dependency of the pinned ``kubernetes`` client); nothing is downloaded, and the browser reaches nothing
but the URL it is given (a fresh profile, no extensions, no background networking).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket


class BrowserError(AssertionError):
    pass


class Chromium:
    """One headless browser with one tab; a context manager (the process is stopped on exit)."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        exe = shutil.which("chromium")
        if exe is None:
            raise BrowserError("no `chromium` on PATH: install Debian's chromium (make system-packages)")
        self.width, self.height = width, height
        profile.mkdir(parents=True, exist_ok=True)
        args = [
            exe,
            "--headless=new",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
        self.log = (profile / "chromium.log").open("wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        port = self._devtools_port(profile / "DevToolsActivePort")
        self.ws = websocket.create_connection(self._page_socket(port), timeout=60, suppress_origin=True)
        self._id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _devtools_port(self, path: Path, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self.proc.returncode}")
            if path.exists() and path.read_text().strip():
                return int(path.read_text().split()[0])
            time.sleep(0.1)
        raise BrowserError(f"chromium wrote no {path.name} in {timeout:.0f}s")

    @staticmethod
    def _page_socket(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t.get("type") == "page")
        return str(page["webSocketDebuggerUrl"])

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return dict(msg.get("result") or {})

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serializable)."""
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression[:80]}...: {res['exceptionDetails']}")
        return (res.get("result") or {}).get("value")

    def open(self, url: str, timeout: float = 30.0) -> None:
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise BrowserError(f"{url} did not load in {timeout:.0f}s")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (the viewport stretched to the page's height)."""
        height = int(self.evaluate("document.documentElement.scrollHeight") or self.height)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=max(height, 200),
            deviceScaleFactor=1,
            mobile=False,
        )
        try:
            data = self.call("Page.captureScreenshot", format="png")["data"]
        finally:
            self.call("Emulation.clearDeviceMetricsOverride")
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
