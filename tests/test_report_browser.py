"""The HTML report in a real browser: headless Chromium, driven over the DevTools protocol, loads the
page, every picture decodes, nothing is logged as an error, and a screenshot is taken."""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import subprocess
import time
import urllib.request

import pytest

import synthetic
from helpers import gctestbed

pytestmark = pytest.mark.browser


def chromium() -> str:
    return next(p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p)


class Page:
    """One headless Chromium tab over the DevTools protocol: navigate, evaluate, screenshot, and the
    console errors and exceptions seen since it opened."""

    def __init__(self, profile: pathlib.Path):
        import websocket
        self.proc = subprocess.Popen([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu",
                                      "--no-first-run", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                      "--window-size=1280,2000", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(url, timeout=60)
        self.next_id, self.events, self.errors = 0, [], []
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(method)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]
            self._event(msg)

    def _event(self, msg: dict) -> None:
        self.events.append(msg.get("method"))
        p = msg.get("params", {})
        if msg.get("method") == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
            self.errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description")))
                                                                        for a in p["args"]))
        elif msg.get("method") == "Runtime.exceptionThrown":
            details = p["exceptionDetails"]
            self.errors.append(f"exception: {details.get('text', '')} {details.get('exception', {}).get('description', '')}")
        elif msg.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
            self.errors.append("log: " + p["entry"]["text"])

    def open(self, path: pathlib.Path) -> None:
        self.call("Page.navigate", url=path.resolve().as_uri())
        while "Page.loadEventFired" not in self.events:
            self._event(json.loads(self.ws.recv()))
        self.call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 200))", awaitPromise=True)

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"]["value"]

    def screenshot(self, path: pathlib.Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
        path.write_bytes(data)
        return data

    def close(self) -> None:
        self.ws.close()
        self.proc.kill()
        self.proc.wait()


IMAGES = "Array.from(document.images).map(i => [i.complete && i.naturalWidth > 0, i.naturalWidth, i.naturalHeight])"


def look(page_path: pathlib.Path, tmp_path: pathlib.Path) -> tuple[list, list[str], bytes]:
    """(each image's [loaded, width, height], the errors logged, the screenshot) of one page."""
    page = Page(tmp_path / "profile")
    try:
        page.open(page_path)
        images = page.evaluate(IMAGES)
        shot = page.screenshot(tmp_path / f"{page_path.stem}.png")
        return images, page.errors, shot
    finally:
        page.close()


def test_the_report_renders_in_chromium(tmp_path):
    synthetic.fill(str(tmp_path / "store"))
    out = tmp_path / "out"
    proc = gctestbed("report", str(tmp_path / "store"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    pictures = json.loads((out / "report.json").read_text())["pictures"]
    images, errors, shot = look(out / "report.html", tmp_path)
    assert len(images) == len(pictures) and all(ok and w > 100 and h > 100 for ok, w, h in images), images
    assert errors == []
    assert shot.startswith(b"\x89PNG\r\n\x1a\n") and len(shot) > 20_000


def test_the_browser_check_sees_a_broken_picture_and_a_console_error(tmp_path):
    """The same check on a page with one good and one broken picture and a script error."""
    import io
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    buf = io.BytesIO()                      # a small PNG from the encoder the report uses
    plt.figure(figsize=(1, 1), dpi=50).savefig(buf, format="png")
    good = base64.b64encode(buf.getvalue()).decode()
    page = tmp_path / "planted.html"
    page.write_text(f'<html><body><img src="data:image/png;base64,{good}">'
                    f'<img src="data:image/png;base64,{good[:40]}">'
                    '<script>console.error("planted"); undefinedFunction();</script></body></html>')
    images, errors, _ = look(page, tmp_path)
    assert [ok for ok, _, _ in images] == [True, False]
    assert any("planted" in e for e in errors) and any("undefinedFunction" in e for e in errors), errors
