"""A real JupyterLab server and headless Chromium driven over the DevTools protocol.

``jupyter_lab(folder)`` starts ``jupyter lab`` on a free local port (token, isolated config
and runtime folders); ``DevTools(url)`` opens a page in the system's Chromium and talks to it
over its DevTools websocket (tornado's client: no extra dependency): ``evaluate`` runs
JavaScript in the page, ``wait_for`` polls a JavaScript condition, ``click`` sends a real
(trusted) mouse click at an element's centre, as a person's click would arrive.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from browser import CHROMIUM


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_http(url, process, timeout_s=90):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.read()
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing answered at {url} within {timeout_s} s")


@contextlib.contextmanager
def jupyter_lab(folder, tmp_path):
    """``(base_url, token)`` of a JupyterLab serving ``folder``; stopped on exit."""
    port, token = free_port(), "aoizora-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "jupyter-workspaces")}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={folder}", "--LabApp.news_url=", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "jupyter.log").open("w"))
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/api/status?token={token}", server)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


class DevTools:
    """One Chromium page under remote control (see the module docstring)."""

    def __init__(self, url, tmp_path):
        from tornado.ioloop import IOLoop
        from tornado.websocket import websocket_connect

        profile = tmp_path / "chromium-profile"
        self.browser = subprocess.Popen(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "--window-size=1400,1000", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(profile) / "DevToolsActivePort"
        end = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > end or self.browser.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.loads(_wait_http(f"http://127.0.0.1:{port}/json/list", self.browser))
        page = next(t for t in targets if t["type"] == "page")
        self.loop = IOLoop(make_current=False)
        self.socket = self.loop.run_sync(lambda: websocket_connect(
            page["webSocketDebuggerUrl"], max_message_size=64 * 2**20))
        self.next_id = 0

    def send(self, method, **params):
        self.next_id += 1
        ask = self.next_id

        async def exchange():
            await self.socket.write_message(json.dumps(
                {"id": ask, "method": method, "params": params}))
            while True:
                message = json.loads(await self.socket.read_message())
                if message.get("id") == ask:
                    return message

        reply = self.loop.run_sync(exchange, timeout=120)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def evaluate(self, expression):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, condition, timeout_s=120, what=None):
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            value = self.evaluate(condition)
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"not within {timeout_s} s: {what or condition}")

    def click(self, selector_expression):
        """Click the centre of the element ``selector_expression`` (JavaScript) evaluates to."""
        box = self.evaluate(f"(() => {{ const e = {selector_expression}; e.scrollIntoView();"
                            " const r = e.getBoundingClientRect();"
                            " return [r.x + r.width / 2, r.y + r.height / 2]; })()")
        # The pointer moves there first: a menu activates the item under it on hover.
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def screenshot(self, path):
        import base64

        data = self.send("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self):
        with contextlib.suppress(Exception):
            self.socket.close()
        self.browser.terminate()
        try:
            self.browser.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.browser.kill()
