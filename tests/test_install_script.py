"""scripts/install.sh's Chromium step says apt's own reason when the install fails (issue 24: it said "needs root
or sudo" when the real cause was a held dpkg lock). The step runs alone, under bash, with a fake apt-get."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _chromium_step() -> str:
    text = (ROOT / "scripts/install.sh").read_text()
    start = text.index("# Headless Chromium")
    end = text.index("\nfi\n", start) + len("\nfi\n")
    return text[start:end]


@pytest.mark.parametrize(
    "apt_stderr, reason",
    [
        (
            "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)",
            "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)",
        ),
        ("W: some warning\nE: Unable to locate package chromium", "E: Unable to locate package chromium"),
        ("something unexpected", "something unexpected"),  # no E: line: apt's last line
    ],
)
def test_a_failed_chromium_install_prints_apts_reason(tmp_path, apt_stderr, reason):
    bin_dir = (
        tmp_path / "bin"
    )  # PATH = only these: no chromium, a failing apt-get, the few tools the step uses
    bin_dir.mkdir()
    for tool in ("grep", "tail", "mktemp", "rm", "id", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!{shutil.which('bash')}\ncat >&2 <<'MSG'\n{apt_stderr}\nMSG\nexit 100\n")
    apt.chmod(0o755)
    sudo = bin_dir / "sudo"  # a non-root run goes through `sudo -n apt-get ...`: pass it through
    sudo.write_text(f'#!{shutil.which("bash")}\nshift\nexec "$@"\n')
    sudo.chmod(0o755)
    proc = subprocess.run(
        [shutil.which("bash"), "-c", "set -euo pipefail\nEXTRAS=dev\n" + _chromium_step()],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr  # a missing browser never fails the install
    assert proc.stderr.strip() == (
        f"note: could not install chromium: {reason}; the report's browser test will be skipped"
    ), proc.stderr
    assert not list(tmp_path.glob("tmp.*"))  # the apt log is removed
