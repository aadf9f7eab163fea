"""VLLMServerEngine setup without the shared server pair: construction errors, bad URLs / ports, the CPU
launch defaults, a server started in the wrong log-prob mode, no orphan servers after SIGKILL of the trainer,
and the README's server commands. Each test that needs a server starts its own (one at a time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import requests

from lit_rl.models.loading import load_causal_lm, load_tokenizer

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[1]


def _module(path):
    return types.SimpleNamespace(
        model=load_causal_lm(str(path)), tokenizer=load_tokenizer(str(path)), model_path=str(path)
    )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# ----------------------------------------------------------------- no servers
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "exactly one of urls"),
        ({"urls": ["http://a:1"], "launch": {}}, "exactly one of urls"),
        ({"urls": "http://a:1"}, "urls"),
        ({"urls": ["ftp://a"]}, "urls"),
        ({"launch": {"num_servers": 0}}, "launch.num_servers"),
        ({"launch": {"gpus": 1}}, "unknown keys"),
        ({"urls": ["http://a:1"], "request_timeout_s": 0}, "request_timeout_s"),
        ({"urls": ["http://a:1"], "weight_transport": "tcp"}, "weight_transport"),
    ],
)
def test_config_is_validated_at_construction(kwargs, field):
    from lit_rl.rollout.server import VLLMServerEngine

    with pytest.raises(ValueError, match=field):
        VLLMServerEngine(**kwargs)


@pytest.mark.parametrize(
    "extra, added",
    [
        ([], ["--no-enable-chunked-prefill"]),
        (["--max-num-seqs", "8"], ["--no-enable-chunked-prefill"]),
        (["--max-num-batched-tokens", "4096"], []),
        (["--max-num-batched-tokens=4096"], []),
        (["--enable-chunked-prefill"], []),
        (["--no-enable-chunked-prefill"], []),
    ],
)
def test_cpu_launch_default_keeps_prefills_whole_unless_the_user_sets_the_budget(extra, added):
    from lit_rl.rollout._vllm_common import whole_prefill_flags

    assert whole_prefill_flags(extra) == added


@pytest.mark.parametrize(
    "extra, block, backend",
    [
        ([], ["--block-size", "32"], ["--distributed-executor-backend", "uni"]),
        (["--block-size", "128"], [], ["--distributed-executor-backend", "uni"]),
        (["--block-size=64", "--distributed-executor-backend=mp"], [], []),
    ],
)
def test_cpu_launch_flags_default_to_blocks_of_32_unless_the_user_sets_them(extra, block, backend):
    from lit_rl.rollout._vllm_common import cpu_server_flags

    assert cpu_server_flags(extra) == ["--enforce-eager", "--no-enable-chunked-prefill", *block, *backend]


def test_unreachable_url_names_the_setting_and_url(tiny_model_dir):
    from lit_rl.rollout._server_launch import free_port
    from lit_rl.rollout.server import VLLMServerEngine

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=rf"VLLMServerEngine.urls: server {url} is unreachable"):
        VLLMServerEngine(urls=[url]).bind(_module(tiny_model_dir))
    assert time.monotonic() - t0 < 15


def test_port_in_use_names_launch_port(tiny_model_dir):
    import socket

    from lit_rl.rollout.server import VLLMServerEngine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        engine = VLLMServerEngine(launch={"port": port})
        with pytest.raises(ValueError, match=rf"launch.port: port {port} .* in use"):
            engine.bind(_module(tiny_model_dir))
        assert engine._procs == []


# -------------------------------------------------------- no orphan servers
TRAINER = """
import sys, time, types
from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.rollout.server import VLLMServerEngine
if __name__ == "__main__":
    p = sys.argv[1]
    m = types.SimpleNamespace(model=load_causal_lm(p), tokenizer=load_tokenizer(p), model_path=p)
    e = VLLMServerEngine(launch={"num_servers": 1, "max_model_len": 64, "kv_cache_gb": 1})
    e.bind(m)
    print("LAUNCHER", e._procs[0].pid, e.pool.servers[0].url, flush=True)
    time.sleep(600)
"""


# slow: launches a server and kills its trainer (~40 s); the default suite keeps under its 20 minutes
@pytest.mark.slow
def test_sigkill_of_the_trainer_takes_its_servers_down(tiny_model_dir, tmp_path):
    """kill -9 of a process that launched a server: the server's whole process group is gone within seconds."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tiny_model_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    pgid = None
    try:
        line = ""
        t_end = time.monotonic() + 600
        while not line.startswith("LAUNCHER") and time.monotonic() < t_end:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "trainer exited before its server was up"
        _, pid, url = line.split()
        pgid = int(pid)
        assert requests.get(url + "/health", timeout=10).status_code == 200
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        while _group_alive(pgid) and time.monotonic() - t0 < 10:
            time.sleep(0.2)
        assert not _group_alive(pgid), "server processes outlived the SIGKILLed trainer"
        assert time.monotonic() - t0 < 5
        with pytest.raises(requests.ConnectionError):
            requests.get(url + "/health", timeout=5)
    finally:
        proc.kill()
        if pgid is not None and _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


# --------------------------------------------------------- README commands
def _readme_commands():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_readme_test", ROOT / "tests/test_readme.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [c for c in mod.readme_commands() if "grpo_server" in c]


# slow: runs README's server commands end to end (~75 s); CI runs the slow suite too
@pytest.mark.slow
def test_readme_server_commands(tiny_model_dir, tmp_path, monkeypatch):
    """The README's server section as a user types it (a few small steps): the launched-server recipe, then
    `vllm serve` on a 'rollout node' and the trainer job pointed at it by URL."""
    import shlex
    import shutil

    from lit_rl.callbacks import RolloutCallback
    from lit_rl.cli import main
    from lit_rl.rollout._server_http import CPU_SERVER_ENV
    from lit_rl.rollout._server_launch import free_port

    launched, serve, job = _readme_commands()
    assert (
        launched == "lit-rl fit --config configs/grpo_server.yaml" and "api_server" in serve and "urls" in job
    )
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "runs/grpo_server/model")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    short = [
        "--trainer.max_steps",
        "1",
        "--data.init_args.batch_size",
        "4",
        "--rollout.group_size",
        "2",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks",
        "[]",
        "--trainer.logger",
        "false",
    ]
    cli = main([*shlex.split(launched)[1:], *short])
    rc = next(c for c in cli.trainer.callbacks if isinstance(c, RolloutCallback))
    assert cli.model.iteration == 1 and cli.trainer.callback_metrics["rollout/servers_alive"] == 1.0
    assert rc.engine._procs == [] and rc.engine.pool is None  # teardown stopped the launched server

    port = free_port()
    env_part, cmd = serve.split(" ", 1)
    argv = shlex.split(cmd.replace("--port 8000", f"--port {port}")) + [
        "--max-model-len",
        "64",
        "--enforce-eager",
        "--max-num-seqs",
        "16",
        "--distributed-executor-backend",
        "uni",
    ]
    env = {
        **os.environ,
        env_part.split("=")[0]: env_part.split("=")[1],
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        **CPU_SERVER_ENV,
    }  # the README's advice for CPU rollout nodes
    assert argv[0] == "python"
    node = subprocess.Popen(
        [sys.executable, *argv[1:]],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        t_end = time.monotonic() + 600
        while True:
            assert node.poll() is None, "the vLLM server exited"
            try:
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < t_end, "the vLLM server did not come up"
            time.sleep(1)
        job = job.replace("'[http://rollout1:8000,http://rollout2:8000]'", f"'[{url}]'")
        cli = main([*shlex.split(job)[1:], *short, "--trainer.max_steps", "2"])
        assert cli.model.iteration == 2
        # the initial push and one per step: the node serves version 3
        assert requests.get(url + "/weight_info", timeout=10).json()["weight_version"] == "3"
    finally:
        if _group_alive(node.pid):
            os.killpg(node.pid, signal.SIGTERM)
            try:
                node.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)


def test_wrong_logprobs_mode_is_refused_and_a_splitting_cpu_server_warned(tiny_model_dir):
    """One server started the way a user might get wrong (raw log-probs; chunked prefill with a small token
    budget): binding by URL warns naming the prefill flags and refuses naming the log-prob setting."""
    from lit_rl.rollout._server_http import launch_servers
    from lit_rl.rollout.server import VLLMServerEngine

    urls, procs = launch_servers(
        str(tiny_model_dir),
        {
            "num_servers": 1,
            "max_model_len": 96,
            "max_num_seqs": 16,
            "extra_args": ["--logprobs-mode", "raw_logprobs", "--max-num-batched-tokens", "512"],
        },
        "float32",
    )
    try:
        engine = VLLMServerEngine(urls=urls)
        with (
            pytest.warns(
                RuntimeWarning,
                match=rf"urls: server {urls[0]} runs on CPU with chunked prefill and "
                r"max_num_batched_tokens=512 < .* = 16 x 96.*"
                r"--no-enable-chunked-prefill \(or --max-num-batched-tokens 1536\)",
            ),
            pytest.raises(
                ValueError,
                match=rf"VLLMServerEngine.urls: server {urls[0]} runs with "
                r"logprobs_mode='raw_logprobs'; start it with --logprobs-mode "
                r"processed_logprobs",
            ),
        ):
            engine.bind(_module(tiny_model_dir))
        assert engine.pool is None  # refused before any weight push
    finally:
        for p in procs:
            p.stop()
