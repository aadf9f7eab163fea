"""A launched server's free port taken between choosing it and the server's bind (seconds later, after its
imports): the launcher starts that server again on a new port instead of failing the run. Seen in the default
suite beside two in-process vLLM runs, whose engines hold ~9 sockets each on random ports."""

from __future__ import annotations

import socket

import pytest

from lit_rl.rollout import _server_launch, _server_start

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LAUNCH = {"num_servers": 1, "max_model_len": 128, "max_num_seqs": 4, "kv_cache_gb": 1, "timeout_s": 600}


def test_a_free_port_taken_before_the_server_binds_is_chosen_again(tiny_model_dir, monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        real, handed = _server_launch.free_port, []

        def free_port(host="127.0.0.1"):  # the first "free" port is the held one: the race, made certain
            handed.append(taken if not handed else real(host))
            return handed[-1]

        monkeypatch.setattr(_server_launch, "free_port", free_port)
        urls, procs = _server_start.launch_servers(str(tiny_model_dir), LAUNCH, "float32")
        try:
            assert len(handed) == 2 and handed[0] == taken != handed[1]
            assert urls == [f"http://127.0.0.1:{handed[1]}"]
            assert procs[0].alive()
        finally:
            for p in procs:
                p.stop()


def test_a_port_given_by_the_user_is_never_changed(tiny_model_dir):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with pytest.raises(ValueError, match=rf"launch\.port: port {taken} on 127\.0\.0\.1 is in use"):
            _server_start.launch_servers(str(tiny_model_dir), {**LAUNCH, "port": taken}, "float32")
