"""A page in headless Chromium over the DevTools protocol: console errors, requests, screenshot.

Used by the report tests, and by hand:
``.venv/bin/python tests/browser_check.py report.html shot.png``.

Chromium is Debian's package (``make browser`` installs it); the protocol is
spoken over a websocket with aiohttp (already a test dependency), so no
browser driver is needed. What is collected while the page loads: console
messages of level error, uncaught exceptions, log entries of level error
(failed resource loads land there), and every request whose URL is neither
``file:`` nor ``data:`` (the report must need no network).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = Path("/usr/bin/chromium")


@dataclass(slots=True)
class PageCheck:
    errors: list[str] = field(default_factory=list)
    network: list[str] = field(default_factory=list)
    width: int = 0
    height: int = 0


async def check_page(page: Path, screenshot: Path, *, width: int = 1280) -> PageCheck:
    profile = Path(tempfile.mkdtemp(prefix="lavad-chromium-"))
    process = subprocess.Popen(
        [
            str(CHROMIUM),
            "--headless=new",
            "--no-sandbox",  # root in containers
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = await _devtools_port(profile / "DevToolsActivePort", process)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with session.ws_connect(url, max_msg_size=0) as ws:
                return await _drive(ws, page, screenshot, width)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)


async def _devtools_port(path: Path, process: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode} before it listened")
        if path.exists():
            first = path.read_text().splitlines()[:1]
            if first and first[0].isdigit():
                return int(first[0])
        await asyncio.sleep(0.1)
    raise RuntimeError("chromium did not open its DevTools port within 60 s")


async def _drive(ws: Any, page: Path, screenshot: Path, width: int) -> PageCheck:
    ids = itertools.count(1)
    check = PageCheck()
    pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
    loaded = asyncio.Event()

    async def reader() -> None:
        async for message in ws:
            data = message.json()
            if "id" in data and data["id"] in pending:
                pending.pop(data["id"]).set_result(data)
                continue
            method, params = data.get("method"), data.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                texts = [str(a.get("value", a.get("description", ""))) for a in params["args"]]
                check.errors.append("console: " + " ".join(texts))
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description", details.get("text"))
                check.errors.append(f"exception: {text}")
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                check.errors.append(f"log: {entry['text']} {entry.get('url', '')}".strip())
            elif method == "Network.requestWillBeSent":
                url = params["request"]["url"]
                if not url.startswith(("file:", "data:")):
                    check.network.append(url)
            elif method == "Page.loadEventFired":
                loaded.set()

    async def call(method: str, **params: Any) -> dict[str, Any]:
        number = next(ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        pending[number] = future
        await ws.send_json({"id": number, "method": method, "params": params})
        reply = await asyncio.wait_for(future, 60.0)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    task = asyncio.create_task(reader())
    try:
        for domain in ("Runtime", "Log", "Network", "Page"):
            await call(f"{domain}.enable")
        await call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        await call("Page.navigate", url=page.resolve().as_uri())
        await asyncio.wait_for(loaded.wait(), 60.0)
        metrics = await call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize", metrics.get("contentSize", {}))
        check.width = int(size.get("width", width))
        check.height = int(size.get("height", 900))
        shot = await call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": check.width, "height": check.height, "scale": 1},
        )
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        # Late console messages (none expected: the page has no script).
        await asyncio.sleep(0.3)
    finally:
        task.cancel()
    return check


if __name__ == "__main__":
    result = asyncio.run(check_page(Path(sys.argv[1]), Path(sys.argv[2])))
    sys.stdout.write(
        f"{result.width}x{result.height}; errors: {result.errors}; network: {result.network}\n"
    )
