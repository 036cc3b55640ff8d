"""report.html in a real browser: headless Chromium driven through the Chrome DevTools protocol.

The page must load with no console error, no uncaught exception and no request other than the file
itself (its Content-Security-Policy forbids any); every plot must have a size on screen; the page
follows prefers-color-scheme. A doctored copy of the page (an external image, a console.error) proves
that the checker notices both. Skips only when Chromium is not installed (CI: `apt-get install chromium`).

Set ADVISOR_REPORT_SHOTS=DIR to keep the light and dark screenshots for a person to look at.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from advisor.cli import main

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"),
                             shutil.which("google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--mute-audio", "--remote-debugging-port=0", "--remote-allow-origins=*"]


# ----------------------------------------------------------------------------- a minimal CDP client


class DevTools:
    """One page target over a WebSocket (RFC 6455, client side: masked text frames)."""

    def __init__(self, ws_url: str, timeout: float = 30.0):
        rest = ws_url.split("://", 1)[1]
        hostport, path = rest.split("/", 1)
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
                          .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed the handshake")
            head += chunk
        status = head.split(b"\r\n", 1)[0]
        assert b" 101 " in status, status
        self.buf = head.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0
        self.events: list[dict] = []

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _recv_message(self) -> dict:
        data = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the connection")
            if opcode in (0x9, 0xA):  # ping / pong: not expected from Chromium
                continue
            data += payload
            if b0 & 0x80:
                return json.loads(data)

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        payload = json.dumps({"id": self.next_id, "method": method, "params": params}).encode()
        header = bytes([0x81])
        n = len(payload)
        header += bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536
                                                    else bytes([0x80 | 127]) + struct.pack(">Q", n))
        mask = os.urandom(4)
        self.sock.sendall(header + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(payload)))
        while True:
            msg = self._recv_message()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        while time.monotonic() < deadline:
            msg = self._recv_message()
            if msg.get("method") == method:
                return msg
            self.events.append(msg)
        raise TimeoutError(method)

    def drain(self, seconds: float) -> None:
        """Collect events for a while (late console messages, late requests)."""
        self.sock.settimeout(0.2)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self.events.append(self._recv_message())
            except (socket.timeout, TimeoutError):
                continue
        self.sock.settimeout(30)

    def evaluate(self, expression: str):
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return res["result"].get("value")

    def close(self) -> None:
        self.sock.close()


def problems(events: list[dict], page_url: str) -> list[str]:
    """Console errors, exceptions, failed requests and any request but the page itself."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description", "")))
                                                          for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            out.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif m == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            out.append(f"log {p['entry']['level']} ({p['entry'].get('source')}): {p['entry']['text']}")
        elif m == "Network.requestWillBeSent" and p["request"]["url"] != page_url \
                and not p["request"]["url"].startswith("data:"):
            out.append(f"request: {p['request']['url']}")
        elif m == "Network.loadingFailed":
            out.append(f"failed request: {p.get('errorText')} {p.get('blockedReason', '')}")
        elif m == "Network.responseReceived" and int(p["response"].get("status", 200) or 200) >= 400:
            out.append(f"HTTP {p['response']['status']}: {p['response']['url']}")
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            if "DevTools listening on ws://" in line:
                port = int(line.split("ws://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        assert port, "chromium did not announce its DevTools port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        cdp = DevTools(pages[0]["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.send(f"{domain}.enable")
        cdp.send("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)
        yield cdp
        cdp.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def load(cdp: DevTools, path: Path) -> str:
    url = path.resolve().as_uri()
    cdp.events.clear()
    cdp.send("Page.navigate", url=url)
    cdp.wait_for("Page.loadEventFired")
    cdp.drain(0.8)
    return url


@pytest.fixture(scope="module")
def report_html(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser-study")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["tune", "--gpu-budget", "24GB", "--model", "qwen7b", "--backend", "estimate", "--reports-dir",
                     str(root), "--trials", "12", "--json"]) == 0
        study_dir = next(p.parent for p in root.glob("*/study.db"))
        assert main(["report", str(study_dir), "--json"]) == 0
    return study_dir / "report.html"


def _shot(cdp: DevTools, name: str, tmp: Path) -> Path:
    data = base64.b64decode(cdp.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    keep = os.environ.get("ADVISOR_REPORT_SHOTS")
    out = Path(keep) if keep else tmp
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_bytes(data)
    return path


def _distinct_colors(png: Path) -> int:
    from PIL import Image

    with Image.open(png) as im:
        small = im.convert("RGB").resize((320, max(1, im.height * 320 // im.width)))
        return len(small.getcolors(maxcolors=1 << 24))


def test_report_loads_offline_without_errors_and_shows_its_plots(browser, report_html, tmp_path):
    url = load(browser, report_html)
    assert problems(browser.events, url) == []
    requests = [e for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
    assert [e["params"]["request"]["url"] for e in requests] == [url]  # the file itself, nothing else
    sizes = browser.evaluate("[...document.querySelectorAll('svg.plot')].map(s => {"
                             "const r = s.getBoundingClientRect(); return [s.dataset.plot, r.width, r.height]; })")
    plots = {name: (w, h) for name, w, h in sizes}
    assert set(plots) >= {"pareto", "ledger", "timeline"}, plots
    assert all(w > 600 and h > 200 for w, h in plots.values()), plots
    winner = browser.evaluate("document.querySelector('.answer').innerText")
    assert "Winner #" in winner and "tokens/s" in winner
    rows = browser.evaluate("document.querySelectorAll('#trials tbody tr').length")
    assert rows == len(list(sqlite3.connect(report_html.parent / "study.db").execute("SELECT 1 FROM trials")))
    light = _shot(browser, "report-light.png", tmp_path)
    assert _distinct_colors(light) > 50  # a rendered page, not a blank one
    assert browser.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(255, 255, 255)"


def test_report_follows_dark_mode(browser, report_html, tmp_path):
    browser.send("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "dark"}])
    try:
        url = load(browser, report_html)
        assert problems(browser.events, url) == []
        assert browser.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(20, 22, 26)"
        # plot text and axes take the page's text colour (currentColor), light on the dark background
        ink = browser.evaluate("getComputedStyle(document.querySelector('svg.plot')).color")
        assert ink == "rgb(228, 230, 234)", ink
        _shot(browser, "report-dark.png", tmp_path)
    finally:
        browser.send("Emulation.setEmulatedMedia", features=[{"name": "prefers-color-scheme", "value": "light"}])


def test_checker_catches_console_errors_and_requests(browser, report_html, tmp_path):
    """The same checks on a doctored copy: without its CSP, with an external image and a console.error."""
    html = report_html.read_text(encoding="utf-8")
    start = html.index('<meta http-equiv="Content-Security-Policy"')
    html = html[:start] + html[html.index(">", start) + 1:]
    html = html.replace("</main>", '<img src="http://127.0.0.1:9/x.png" alt=""><script>console.error("doctored")'
                                   "</script></main>")
    bad = tmp_path / "doctored.html"
    bad.write_text(html, encoding="utf-8")
    url = load(browser, bad)
    found = problems(browser.events, url)
    assert any("console.error: doctored" in p for p in found), found
    assert any("request: http://127.0.0.1:9/x.png" in p for p in found), found
    assert any(p.startswith("failed request") for p in found), found
