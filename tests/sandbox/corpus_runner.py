"""Run the adversarial corpus (adversarial_corpus.py) against the real sandbox and CodeTestsReward.

    python tests/sandbox/corpus_runner.py [--json]      # a table, or one JSON object (used by the tests)

This process is the *caller*: if any program kills or stops it, no result comes back and the test that
started it fails (the caller must survive every program). Standard library only, so it also runs as an
unprivileged user under the system Python (user-namespace mode); as root it uses root mode.

Each case runs once as a plain sandboxed program (escape oracles) and once scored as a solution of
``add(a, b)`` (reward oracle). Listeners, the canary and the host secret are made reachable for an
unsandboxed process run as the sandbox uid (world-readable/writable), so only the isolation stops them.
Network traffic goes only to loopback listeners started here, and only if the sandbox were broken.
Oracles per case: no ``ESCAPED!``, canary or secret in the output, no listener hit, no host file written,
no process left behind (root mode: per-run uid), not ``infra_error`` (an attack must never get its row
masked), reward 0, and a hanging program returns within timeout + 1 s (both as a program and as a reward).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sbx_caller import REPO, import_rewards_stdlib_only

import_rewards_stdlib_only()
from adversarial_corpus import CASES

from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.sandbox import _UID_BASE, _UID_SPAN, Sandbox, SandboxLimits

TIMEOUT = 1.0
TOTAL_MEMORY_MB = 192  # whole-run cap (cgroup) for the corpus: the multi-process bomb must stay under it
ADD_TESTS = [
    {"call": "add", "args": [2, 3], "expected": 5},
    {"call": "add", "args": [-7, 4], "expected": -3},
    {"stdin": "2 3\n", "stdout": "5\n"},
]
ADD_SOLUTION = (
    "def add(a, b):\n    return a + b\n\n"
    "if __name__ == '__main__':\n    print(add(*map(int, input().split())))\n"
)


class Ctx:
    """Host-side bait: loopback listeners, an env canary, a world-readable secret file, writable targets."""

    def __init__(self, cgroup: bool, root_mode: bool = True):
        self.dir = tempfile.mkdtemp(prefix="lit_rl_bait_")
        os.chmod(self.dir, 0o777)
        self.secret = "host-secret-" + secrets.token_hex(12)
        self.secret_path = os.path.join(self.dir, "lit_rl_secret.txt")
        Path(self.secret_path).write_text(self.secret)
        os.chmod(self.secret_path, 0o644)
        self.canary = "canary-" + secrets.token_hex(12)
        os.environ["LIT_RL_CANARY_TOKEN"] = self.canary  # in the caller's environment, never in the sandbox's
        self.cgroup, self.root_mode = cgroup, root_mode
        self.hits: list[tuple[float, str]] = []  # (time, listener) of every connection / datagram
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_path = os.path.join(self.dir, "bait.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen()
        os.chmod(self.unix_path, 0o777)
        self.abstract = "lit_rl_bait_" + secrets.token_hex(6)
        self.abs_sock = socket.socket(socket.AF_UNIX)
        self.abs_sock.bind("\0" + self.abstract)
        self.abs_sock.listen()
        self.output_cap = SandboxLimits().output_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        socks = {self.tcp: "tcp", self.udp: "udp", self.unix: "unix", self.abs_sock: "abstract"}
        while not self._stop.is_set():
            ready, _, _ = select.select(list(socks), [], [], 0.1)
            for s in ready:
                if s is self.udp:
                    self.udp.recvfrom(4096)
                else:
                    s.accept()[0].close()
                self.hits.append((time.time(), socks[s]))

    def write_path(self, case: str) -> str:
        return os.path.join(self.dir, f"escaped_{case}.txt")

    def targets(self, case: str) -> list[str]:
        """Host paths case ``case`` tries to write (none may exist afterwards)."""
        return [
            self.write_path(case),
            "/usr/lit_rl_escape",
            "/etc/lit_rl_escape",
            "/lit_rl_escape",
            str(REPO / "lit_rl_escape"),
        ]

    def fill(self, code: str, case: str) -> str:
        return (
            code.replace("@TCP_PORT@", str(self.tcp.getsockname()[1]))
            .replace("@UDP_PORT@", str(self.udp.getsockname()[1]))
            .replace("@UNIX_PATH@", self.unix_path)
            .replace("@ABSTRACT@", self.abstract)
            .replace("@SECRET_PATH@", self.secret_path)
            .replace("@WRITE_PATH@", self.write_path(case))
            .replace("@REPO@", str(REPO))
            .replace("@TEST_FILE@", str(HERE / "test_adversarial.py"))
            .replace("@CGROUP@", str(self.cgroup))
            .replace("@MEM_CAP_MB@", str(TOTAL_MEMORY_MB))
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for s in (self.tcp, self.udp, self.unix, self.abs_sock):
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def processes_of(uids) -> list[tuple[int, int]]:
    """Host processes whose real uid is in ``uids`` (a range or a set), except this one."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uid = int(status.split("\nUid:")[1].split()[0])
        if uid in uids:
            found.append((int(pid), uid))
    return found


def run_case(case, ctx: Ctx, sandbox: Sandbox, rewards: dict) -> dict:
    code = ctx.fill(case.code, case.name)
    start = time.time()
    t0 = time.monotonic()
    res = sandbox.run_python(code)
    elapsed = time.monotonic() - t0
    leftover = (
        [p for p, _ in processes_of({res.uid})] if sandbox.root_mode else []
    )  # per-run uid: attributable
    reward = rewards["partial" if case.reward_hack else "fail_fast"]
    t0 = time.monotonic()
    score = reward({"tests": ADD_TESTS}, code)
    reward_elapsed = time.monotonic() - t0
    window = (start, time.time())
    out = res.stdout + res.stderr
    bad = [ln.decode(errors="replace") for ln in out.splitlines() if b"ESCAPED!" in ln][:3]
    bad += [
        f"{name} leaked into the output"
        for name, val in (("canary", ctx.canary), ("host secret", ctx.secret))
        if val.encode() in out
    ]
    bad += [f"leftover process {pid}" for pid in leftover]
    infra = res.outcome == "infra_error" or not score.ok
    if infra:
        bad.append(f"attack turned into an infra error (would be masked): {res.error} / reward ok={score.ok}")
    if case.check is not None:
        bad += case.check(ctx, res)
    if case.hangs and (res.status != "timeout" or elapsed > TIMEOUT + 1.0):
        bad.append(f"hanging program: status {res.status}, returned after {elapsed:.2f} s")
    false_pass = score.score != 0.0
    if false_pass:
        bad.append(f"reward {score.score}")
    if case.hangs and reward_elapsed > TIMEOUT + 1.0 + 1.0:  # budget + kill, plus one sandbox start
        bad.append(f"a hanging program's reward took {reward_elapsed:.2f} s > timeout + 2 s")
    return {
        "bad": bad,
        "status": res.status,
        "outcome": res.outcome,
        "elapsed": elapsed,
        "window": window,
        "reward_elapsed": reward_elapsed,
        "program_s": score.info.get("program_s", 0.0),
        "score": score.score,
        "reward_ok": score.ok,
        "infra": infra,
        "false_pass": false_pass,
        "hangs": case.hangs,
    }


def run_corpus(workers: int = 3) -> dict:
    sandbox = Sandbox(
        SandboxLimits(cpu_s=1, memory_mb=256, total_memory_mb=TOTAL_MEMORY_MB), timeout_s=TIMEOUT
    )
    rewards = {
        "partial": CodeTestsReward("partial", timeout_s=TIMEOUT, sandbox=sandbox),
        "fail_fast": CodeTestsReward("binary", timeout_s=TIMEOUT, sandbox=sandbox, fail_fast=True),
    }
    ctx = Ctx(sandbox.cgroups.available, sandbox.root_mode)
    try:
        control = {
            k: (r({"tests": ADD_TESTS}, ADD_SOLUTION).score, r({"tests": ADD_TESTS}, ADD_SOLUTION).ok)
            for k, r in rewards.items()
        }  # without this, "every attack scores 0" holds for a broken reward
        t0 = time.monotonic()
        # cases run 3 at a time (each is mostly waiting on sandboxed children or on a timeout); every oracle
        # is per case: its own uid (root mode), its own write target, listener hits inside its own window
        with ThreadPoolExecutor(workers) as ex:
            results = dict(
                zip([c.name for c in CASES], ex.map(lambda c: run_case(c, ctx, sandbox, rewards), CASES))
            )
        corpus_s = time.monotonic() - t0
        time.sleep(
            max(0.2, 3.5 - (time.time() - max(r["window"][0] for r in results.values())))
        )  # late daemons
        for name, r in results.items():
            lo, hi = r["window"]
            r["bad"] += [
                f"listener {kind} reached at {t:.2f}" for t, kind in ctx.hits if lo - 0.5 <= t <= hi + 0.5
            ]
            r["bad"] += [f"host file written: {p}" for p in ctx.targets(name) if os.path.lexists(p)]
            r["escape"] = any(
                not b.startswith(("reward ", "attack turned", "hanging", "a hanging")) for b in r["bad"]
            )
        uids = range(_UID_BASE, _UID_BASE + _UID_SPAN) if sandbox.root_mode else {os.getuid()}
        leftover = processes_of(uids)
        hangs = [r for r in results.values() if r["hangs"]]
        summary = {
            "mode": "root" if sandbox.root_mode else f"non-root uid {os.getuid()} (user namespace)",
            "cgroup": sandbox.cgroups.version or f"none ({sandbox.cgroups.reason[:80]})",
            "cases": len(results),
            "escapes": sum(r["escape"] for r in results.values()),
            "false_passes": sum(r["false_pass"] for r in results.values()),
            "infra_errors": sum(r["infra"] for r in results.values()),
            "violations": sum(bool(r["bad"]) for r in results.values()),
            "hang_cases": len(hangs),
            "max_hang_wall_s": max(r["elapsed"] for r in hangs),
            "max_hang_reward_program_s": max(r["program_s"] for r in hangs),
            "max_hang_reward_wall_s": max(r["reward_elapsed"] for r in hangs),
            "timeout_s": TIMEOUT,
            "listener_hits": len(ctx.hits),
            "leftover_processes": len(leftover),
            "control": control,
            "corpus_s": corpus_s,
            "caller_survived": True,
        }
        return {"summary": summary, "cases": results}
    finally:
        ctx.close()


def main() -> None:
    out = run_corpus()
    if "--json" in sys.argv:
        print(json.dumps(out))
        return
    s = out["summary"]
    for name, r in out["cases"].items():
        if r["bad"]:
            print(f"VIOLATION {name}: {r['bad']}")
    print(
        "| caller | cgroup | cases | escapes | false passes | candidate-caused infra_errors | "
        "max hang wall (program / reward program time / reward wall) | timeout + 1 s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {s['mode']} | {s['cgroup']} | {s['cases']} | {s['escapes']} | {s['false_passes']} | "
        f"{s['infra_errors']} | {s['max_hang_wall_s']:.2f} / {s['max_hang_reward_program_s']:.2f} / "
        f"{s['max_hang_reward_wall_s']:.2f} s | {s['timeout_s'] + 1:.2f} s |"
    )
    print(
        f"caller survived every program; leftover processes {s['leftover_processes']}, listener hits "
        f"{s['listener_hits']}, control scores {s['control']}, corpus ran in {s['corpus_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
