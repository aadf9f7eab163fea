"""lit_rl.core must stay pure torch: importing any of its modules pulls in no framework.

Runs in a subprocess so that whatever this pytest process has already imported (Lightning via
conftest plugins, transformers via other tests) cannot hide or fake a leak.
"""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("lightning", "pytorch_lightning", "lightning_fabric", "vllm", "ray", "transformers")

_PROBE = """
import importlib, json, pkgutil, sys
import lit_rl.core as core
names = sorted(m.name for m in pkgutil.walk_packages(core.__path__, prefix="lit_rl.core."))
for name in names:
    importlib.import_module(name)
forbidden = {forbidden!r}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps({{"modules": names, "leaked": leaked}}))
"""


def _probe() -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _PROBE.format(forbidden=FORBIDDEN)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the return code is asserted below, with stderr in the message
    )
    assert res.returncode == 0, f"importing lit_rl.core modules failed:\n{res.stderr}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_core_imports_no_framework():
    info = _probe()
    # Discovery must actually find the modules (a broken walk would pass vacuously).
    assert "lit_rl.core.registry" in info["modules"]
    assert "lit_rl.core.logprobs" in info["modules"]
    assert "lit_rl.core.kl" in info["modules"]
    assert info["leaked"] == [], f"lit_rl.core imports framework modules: {info['leaked']}"
