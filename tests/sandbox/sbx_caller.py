"""A stand-alone caller of the sandbox, for tests that must survive (or watch) what the program does to it.

    python tests/sandbox/sbx_caller.py MODE TIMEOUT_S [PROCESSES] < program.py   ->  one JSON line

``MODE`` is a ``Sandbox`` mode (auto / root / userns). Runs under any Python >= 3.9 with the standard library
only -- e.g. the system ``/usr/bin/python3`` as an unprivileged user: ``lit_rl`` and ``lit_rl.rewards`` are
registered as bare namespace packages, so importing the sandbox does not run the package ``__init__`` files
(which import torch).
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def import_rewards_stdlib_only():
    """Make ``lit_rl.rewards.{sandbox,code,...}`` importable without running the package ``__init__``s."""
    for name, path in (("lit_rl", REPO / "lit_rl"), ("lit_rl.rewards", REPO / "lit_rl" / "rewards")):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [str(path)]
            sys.modules[name] = mod


def main() -> None:
    import_rewards_stdlib_only()
    from lit_rl.rewards.sandbox import Sandbox, SandboxLimits

    mode, timeout = sys.argv[1], float(sys.argv[2])
    processes = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    sb = Sandbox(
        SandboxLimits(cpu_s=3, memory_mb=256, processes=processes),
        timeout_s=timeout,
        mode=mode,
        python=os.environ.get("SBX_PYTHON") or None,
    )
    res = sb.run_python(sys.stdin.read())
    print(
        json.dumps(
            {
                "status": res.status,
                "outcome": res.outcome,
                "exit_code": res.exit_code,
                "wall_s": res.wall_s,
                "error": res.error,
                "root_mode": sb.root_mode,
                "caller_pid": os.getpid(),
                "stdout": res.stdout.decode(errors="replace")[-2000:],
                "stderr": res.stderr.decode(errors="replace")[-2000:],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
