"""Headless Chromium for the report tests: offline, with JavaScript errors on stderr."""

import os
import subprocess
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


def require_chromium():
    """The browser tests are part of the proof: in CI (``$CI`` set, as ``.ci/run`` runs) a
    missing Chromium fails the test; a local run without one skips it, saying how to get it."""
    if os.access(CHROMIUM, os.X_OK):
        return
    why = f"Chromium is not installed at {CHROMIUM} (`apt-get install chromium`, as .ci/run does)"
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run the browser tests.", pytrace=False)
    pytest.skip(why)


def chromium(tmp_path, url, *flags):
    """Headless Chromium with every network request failing; returns (stdout, stderr)."""
    done = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=10000",
         "--enable-logging=stderr", "--v=0", *flags, url],
        capture_output=True, text=True, timeout=120, check=False)
    return done.stdout, done.stderr


def js_errors(stderr):
    return [line for line in stderr.splitlines() if "Uncaught" in line]
