"""Headless Chromium for the report tests: offline, with JavaScript errors on stderr."""

import subprocess
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


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
