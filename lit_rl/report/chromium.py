"""Headless Chromium for checking the report in a real browser (tests, ``scripts/bench_report.py``).

``dump_dom`` loads a page, lets its scripts run and returns the serialised DOM; ``screenshot`` writes a PNG.
Chromium runs with a fresh profile and no network features (the report needs none), and ``--no-sandbox``
because the test machines run as root, where Chromium refuses its own sandbox.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)


def find_chromium() -> str | None:
    env = os.environ.get("LIT_RL_CHROMIUM")
    for c in ((env,) if env else ()) + CANDIDATES:
        if c and Path(c).exists():
            return c
    return shutil.which("chromium")


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError(
            "chromium not found (Debian: apt-get install -y chromium; or set LIT_RL_CHROMIUM)"
        )
    with tempfile.TemporaryDirectory(prefix="lit_rl_chromium_") as profile:
        cmd = [exe, *FLAGS, f"--user-data-dir={profile}", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"chromium exited {res.returncode}: {res.stderr[-2000:]}")
    return res


def dump_dom(url: str, timeout_s: float = 60.0, budget_ms: int = 5000) -> str:
    """The DOM of ``url`` after its scripts ran (``--dump-dom``; ``budget_ms`` of virtual time for timers)."""
    return _run([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout_s).stdout


def screenshot(
    url: str, out: str | Path, size: tuple[int, int] = (1400, 1000), timeout_s: float = 60.0
) -> Path:
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(
        [f"--window-size={size[0]},{size[1]}", "--virtual-time-budget=5000", f"--screenshot={out}", url],
        timeout_s,
    )
    if not out.exists():
        raise RuntimeError(f"chromium did not write the screenshot {out}")
    return out
