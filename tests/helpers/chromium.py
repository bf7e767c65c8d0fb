"""Render a local HTML file in headless Chromium and record what the page did, over the
DevTools protocol (CDP) on a websocket.

Why CDP rather than parsing `--enable-logging` output or serving the file from a local HTTP
server: CDP reports each console message with its level (so errors are told from logs), every
uncaught exception, and every request the page starts (`Network.requestWillBeSent`), whatever
its scheme or host; a local server would see only the requests sent to it, and the log output
does not mark levels. The page is opened from a file:// URL, so any other URL is a fetch.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
    "--hide-scrollbars",
]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    requests: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    screenshot: bytes = b""
    title: str = ""
    text: str = ""
    values: dict[str, object] = field(default_factory=dict)


def render(
    page: Path,
    width: int = 1200,
    height: int = 1600,
    timeout: float = 60,
    expressions: dict[str, str] | None = None,
) -> Rendered:
    """Open ``page``, record what it did, screenshot it whole; ``expressions``: JavaScript to
    evaluate in the loaded page, each result (by value) in ``Rendered.values`` by name."""
    from websockets.sync.client import connect

    exe = chromium()
    assert exe, "chromium is not installed"
    profile = Path(tempfile.mkdtemp(prefix="i12-chromium-"))
    proc = subprocess.Popen(
        [
            exe,
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        import httpx2 as httpx

        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        out = Rendered()
        with connect(url, max_size=64 * 2**20, open_timeout=timeout) as ws:
            counter = iter(range(1, 10_000))

            def call(method: str, **params: object) -> dict:
                ident = next(counter)
                ws.send(json.dumps({"id": ident, "method": method, "params": params}))
                while True:
                    message = json.loads(ws.recv(timeout=timeout))
                    if message.get("id") == ident:
                        return message.get("result", {})
                    note(message)

            def note(message: dict) -> None:
                method, params = message.get("method"), message.get("params", {})
                if method == "Network.requestWillBeSent":
                    out.requests.append(params["request"]["url"])
                elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                    "error",
                    "assert",
                ):
                    out.console_errors.append(json.dumps(params.get("args"))[:300])
                elif method == "Runtime.exceptionThrown":
                    out.exceptions.append(json.dumps(params.get("exceptionDetails"))[:300])
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    out.log_errors.append(params["entry"].get("text", "")[:300])
                elif method == "Page.loadEventFired":
                    out.title = out.title or "loaded"

            for domain in ("Network", "Runtime", "Log", "Page"):
                call(f"{domain}.enable")
            call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            call("Page.navigate", url=page.resolve().as_uri())
            while out.title != "loaded":
                assert time.monotonic() < deadline + timeout, "the page did not load"
                note(json.loads(ws.recv(timeout=timeout)))
            time.sleep(0.5)  # late requests or errors after load
            evaluated = call(
                "Runtime.evaluate",
                expression="document.title + '\\n' + document.body.innerText",
                returnByValue=True,
            )
            value = evaluated.get("result", {}).get("value", "")
            out.title, _, out.text = value.partition("\n")
            for name, expression in (expressions or {}).items():
                result = call("Runtime.evaluate", expression=expression, returnByValue=True)
                assert "exceptionDetails" not in result, (name, result["exceptionDetails"])
                out.values[name] = result.get("result", {}).get("value")
            full = call(
                "Runtime.evaluate",
                expression="document.documentElement.scrollHeight",
                returnByValue=True,
            )["result"]["value"]
            call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=int(full),
                deviceScaleFactor=1,
                mobile=False,
            )
            shot = call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            out.screenshot = base64.b64decode(shot["data"])
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
