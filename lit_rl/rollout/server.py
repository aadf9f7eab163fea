"""`VLLMServerEngine`: rollouts from separate vLLM server processes (``vllm serve``), weights synced into them.

Generation runs in other processes (on this machine or on rollout nodes), so the trainer's update and the
servers' generation overlap for real in async mode. The engine speaks vLLM's own HTTP API:

* ``POST /v1/completions`` with a token-id prompt, ``n = group_size`` (a group stays on one server, where its
  prompt's KV blocks are cached), ``logprobs=0`` and ``return_token_ids``: token ids in, token ids and the
  sampled tokens' log-probs out. The servers must run with ``--logprobs-mode processed_logprobs`` (checked
  at setup), which gives the log-probs of the processed distribution sampled from (repetition penalty,
  temperature, min-p, top-k, top-p): the project convention (``lit_rl.rollout.sampling``), exactly as the
  in-process ``VLLMEngine``. Stop strings are sent as ``stop`` and the completion cut by ``cut_at_stop``.
* Weight sync (the servers must run with ``VLLM_SERVER_DEV_MODE=1``): transport ``file`` (default, CPU or
  same host / shared file system): the learner writes one safetensors file to ``sync_dir`` (``/dev/shm``), each
  server reloads it (``POST /collective_rpc`` → worker ``reload_weights(weights_path=...)``), drops its prefix
  cache (``/reset_prefix_cache``), gets the new version (``/update_weight_version``) and must report it back
  (``GET /weight_info``); a server that does not fails the step. Transport ``nccl`` (GPU, across hosts):
  vLLM's weight-transfer engine (``/init_weight_transfer_engine`` + ``/update_weights``; the servers need
  ``--weight-transfer-config '{"backend": "nccl"}'``) broadcasts every tensor from trainer rank 0.
* LoRA (``lora_sync``): a LoRA policy's sync can write only its adapter, which every server loads as
  ``policy-vN`` beside its base weights; requests then name it. See ``_server_lora`` for when this path runs.
* Load balancing and failures: each prompt is one request sent to the live server with the fewest requests in
  flight (ties round-robin; ``rollout/server{i}_requests`` counts each server's answers). A server that
  refuses connections, times out (``request_timeout_s``), answers 5xx or returns a malformed body is marked
  dead for the rest of the run (a restarted server would hold the base weights) and its requests go to
  another server (``rollout/server_errors``, ``rollout/retries`` in ``metrics()``). With
  no live server left, ``generate`` raises naming every URL: never a hang.

With DDP every rank has its own engine on the same servers; only rank 0 writes and pushes weights (the
ranks' weights are equal after a step), the others wait on a gloo group of their own and check the version.
Launched servers (``launch=``) are owned by the engine: see ``_server_launch`` for the no-orphan guarantees.
"""
from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from torch import Tensor

from lit_rl.rollout import _server_lora as lora
from lit_rl.rollout._server_http import ServerPool
from lit_rl.rollout._vllm_common import (
    SeededRequests,
    architectures,
    check_prompts,
    check_weight_names,
    deprecated_overlong,
    dtype_name,
    make_sync_dir,
    sampling_fields,
    write_weights_file,
)
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.engine import Completion, SamplingConfig
from lit_rl.rollout.sampling import cut_at_stop, deprecated_truncation_flag

_log = logging.getLogger(__name__)
TRANSPORTS = ("file", "nccl")
LAUNCH_KEYS = {"num_servers", "threads_per_server", "host", "port", "max_model_len", "max_num_seqs", "dtype",
               "kv_cache_gb", "extra_args", "env", "timeout_s"}


class VLLMServerEngine(SeededRequests, EngineBase):
    """Generation through vLLM servers addressed by URL or launched by the engine (a ``RolloutEngine``).

    Args:
        urls: base URLs of running servers (``http://host:port``), started with ``VLLM_SERVER_DEV_MODE=1`` and
            ``--logprobs-mode processed_logprobs``. Exactly one of ``urls`` / ``launch``.
        launch: start servers on this machine at ``bind`` (stopped at teardown / process exit): keys
            ``num_servers`` (1), ``threads_per_server`` (1: CPU threads of each server), ``host``
            (127.0.0.1), ``port`` (first port, servers use port, port+1, ...; null = free ports),
            ``max_model_len``, ``max_num_seqs``, ``dtype`` (null = the policy's), ``kv_cache_gb`` (1, CPU KV
            cache), ``extra_args`` (more ``vllm serve`` flags), ``env`` (more environment), ``timeout_s``
            (600: start-up limit).
        request_timeout_s: one request's limit on one server; a slower server counts as failed and the request
            goes to another one.
        sync_timeout_s: a weight sync slower than this raises.
        weight_transport: ``file`` (safetensors in ``sync_dir``; servers must see that path) | ``nccl``.
        sync_dir: where weight files go; null = a fresh directory in ``/dev/shm``.
        seed: base of the per-request sampling seeds when ``SamplingConfig.seed`` is None.
        overlong_prompts: deprecated, no effect (as ``VLLMEngine``: prompts over the context raise; the renderer
            decides prompt length from this engine's ``max_model_len``).
        allow_truncated_logprobs: deprecated, no effect (every sampling setting works; the log-probs are those of
            the processed distribution sampled from, ``lit_rl.rollout.sampling``).
        max_concurrency: requests in flight from this engine at once (threads).
        lora_sync: ``auto`` (a LoRA policy syncs only its adapter when every server accepts it, else merged
            weights) | ``adapter`` (the adapter path or an error at setup) | ``merged`` (always merged weights).
            ``launch`` adds the LoRA flags for ``adapter`` only (generating through an adapter is slower per
            token). Chosen at ``bind``: ``sync_path``, and why in ``sync_path_reason``.
    """

    def __init__(self, urls: list[str] | None = None, launch: dict[str, Any] | None = None,
                 request_timeout_s: float = 120.0, sync_timeout_s: float = 300.0, weight_transport: str = "file",
                 sync_dir: str | None = None, seed: int = 0, overlong_prompts: str | None = None,
                 allow_truncated_logprobs: bool = False, max_concurrency: int = 64, lora_sync: str = "auto"):
        if (urls is None) == (launch is None):
            raise ValueError("VLLMServerEngine needs exactly one of urls (running servers) or launch (start them)")
        if urls is not None and (isinstance(urls, str) or not urls or not all(
                isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls)):
            raise ValueError(f"VLLMServerEngine.urls must be a non-empty list of http(s)://host:port, got {urls!r}")
        if launch is not None:
            unknown = set(launch) - LAUNCH_KEYS
            if unknown:
                raise ValueError(f"VLLMServerEngine.launch has unknown keys {sorted(unknown)}; allowed: "
                                 f"{', '.join(sorted(LAUNCH_KEYS))}")
            for k in ("num_servers", "threads_per_server"):
                if int(launch.get(k, 1)) < 1:
                    raise ValueError(f"VLLMServerEngine.launch.{k} must be >= 1, got {launch[k]}")
        if not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        if not sync_timeout_s > 0:
            raise ValueError(f"sync_timeout_s must be > 0, got {sync_timeout_s}")
        if weight_transport not in TRANSPORTS:
            raise ValueError(f"weight_transport={weight_transport!r}; valid values: {', '.join(TRANSPORTS)}")
        deprecated_overlong(overlong_prompts, "VLLMServerEngine")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if lora_sync not in lora.LORA_SYNC:
            raise ValueError(f"lora_sync={lora_sync!r}; valid values: {', '.join(lora.LORA_SYNC)}")
        if lora_sync == "adapter" and weight_transport != "file":
            raise ValueError(f"lora_sync='adapter' needs weight_transport='file' (servers load the adapter from a "
                             f"path), got weight_transport={weight_transport!r}")
        self.urls = [u.rstrip("/") for u in urls] if urls is not None else None
        self.launch = dict(launch) if launch is not None else None
        self.request_timeout_s, self.sync_timeout_s = float(request_timeout_s), float(sync_timeout_s)
        self.weight_transport, self.sync_dir_arg, self.seed = weight_transport, sync_dir, seed
        self.allow_truncated_logprobs = deprecated_truncation_flag(allow_truncated_logprobs, "VLLMServerEngine")
        self.max_concurrency = max_concurrency
        self.lora_sync = lora_sync
        self.sync_path: str | None = None  # "adapter" | "merged", chosen at bind
        self.sync_path_reason = ""
        self._lora: lora.AdapterSync | None = None
        self.last_sync_bytes = 0
        self.tokenizer = None
        self.policy_version = 0
        self.last_sync_s = float("nan")
        self.pool: ServerPool | None = None
        self._procs: list = []
        self._module = None
        self._expected_names: set[str] | None = None
        self._needs_initial_sync = False
        self._stale: str | None = None
        self._sync_seq = 0  # syncs pushed to the servers; the version string they must report
        self._sync_dir: str | None = None
        self._seed_cursor = 0
        self._lock = threading.RLock()  # generate and weight sync never overlap
        self._executor: ThreadPoolExecutor | None = None
        self._group = None  # gloo group of the DDP ranks sharing the servers (rank 0 pushes weights)
        self._nccl = None

    # ------------------------------------------------------------------ start
    def bind(self, module) -> None:
        """Start (``launch``) or reach (``urls``) the servers, check them against the policy and choose the
        sync path (``lora_sync``); the first ``generate`` pushes the module's weights (so checkpoint-restored
        weights are what the servers use)."""
        self.tokenizer, self._module = module.tokenizer, module
        if self.pool is None:
            urls = self.urls if self.urls is not None else self._start_servers(module)
            self.pool = ServerPool(urls, self.request_timeout_s)
            try:
                self.pool.check(policy=_policy_info(module), setting="urls" if self.urls is not None else "launch")
            except BaseException:
                self.close()
                raise
        self._check_rollout_settings(module)
        # DDP ranks sharing servers by URL: rank 0 pushes weights, the others check. Launched servers are each
        # rank's own, so every rank pushes to its own.
        self._group = _ddp_group() if self.urls is not None else None
        self._choose_sync_path(module)
        self._expected_names = {n for n, _ in self.sync_items(module.model)}
        self._needs_initial_sync = True

    def _choose_sync_path(self, module) -> None:
        """Adapter or merged weights (``_server_lora.choose``); with DDP rank 0 decides and tells the others."""
        import torch.distributed as dist

        rank0 = self._group is None or dist.get_rank() == 0
        box = [None]
        if rank0:
            try:
                found = lora.choose(self.lora_sync, module.model, self.pool, self._ensure_sync_dir,
                                    self.weight_transport, tag=str(os.getpid()))
                # adapter names carry a run token: two runs sharing a server never load over each other's
                box = [("adapter" if found[0] else "merged", found[1], f"policy-{uuid.uuid4().hex[:8]}-v")]
            except BaseException as exc:
                box = [("error", str(exc), "")]
                if self._group is None:
                    self.close()
                    raise
        if self._group is not None:
            dist.broadcast_object_list(box, src=0, group=self._group)
        path, self.sync_path_reason, prefix = box[0]
        if path == "error":
            self.close()
            raise ValueError(box[0][1])
        self.sync_path = path
        if path != "adapter":
            self._lora = None
        elif self._lora is None:  # a second bind on the same servers keeps the adapter they serve
            self._lora = lora.AdapterSync(lora.policy_lora(module.model), prefix)
        _log.info("VLLMServerEngine weight sync: %s weights (%s)", path, self.sync_path_reason)

    def sync_items(self, model):
        """What ``update_weights`` takes for ``model``: its LoRA adapter's tensors (PEFT names) on the adapter
        path, else its merged weights (``merged_state_items``). RolloutCallback syncs with this."""
        from lit_rl.models.loading import merged_state_items

        return lora.adapter_state_items(model) if self._lora is not None else merged_state_items(model)

    def _ensure_sync_dir(self) -> str:
        if self._sync_dir is None:
            self._sync_dir = self.sync_dir_arg or make_sync_dir()
            os.makedirs(self._sync_dir, exist_ok=True)
        return self._sync_dir

    def _start_servers(self, module) -> list[str]:
        from lit_rl.rollout._server_http import launch_servers

        model = str(getattr(module, "model_path", "") or "")
        if not model:
            raise ValueError("VLLMServerEngine.launch needs a policy module with model_path (the servers load it)")
        launch = lora.launch_with_lora(self.launch, module.model, self.lora_sync)
        urls, self._procs = launch_servers(model, launch, dtype_name(module.model))
        return urls

    def _check_rollout_settings(self, module) -> None:
        """group_size / max_new_tokens of the RolloutCallback against the servers' limits, at setup (the
        callback hands itself to the module, ``module.rollout_source``, before it binds the engine)."""
        src = getattr(module, "rollout_source", None)
        if getattr(src, "engine", None) is self:
            self.check_request_shape(src.group_size, src.sampling.max_new_tokens)

    def check_request_shape(self, n: int, max_new_tokens: int) -> None:
        """Raise when a group of ``n`` or ``max_new_tokens`` cannot be served by every server."""
        for s in self.pool.servers:
            if s.max_num_seqs is not None and n > s.max_num_seqs:
                raise ValueError(f"rollout.group_size={n} exceeds max_num_seqs={s.max_num_seqs} of server {s.url}: "
                                 "a group is one request (n samples) and must fit one server's batch; lower "
                                 "group_size or start the server with a larger --max-num-seqs")
            if max_new_tokens >= s.max_model_len:
                raise ValueError(f"rollout.sampling.max_new_tokens={max_new_tokens} leaves no room for a prompt "
                                 f"within max_model_len={s.max_model_len} of server {s.url}; lower it or start the "
                                 "server with a larger --max-model-len")

    @property
    def max_model_len(self) -> int:
        return min(s.max_model_len for s in self.pool.servers)

    def limits(self) -> dict[str, int | None]:
        return {"max_model_len": self.max_model_len if self.pool is not None else None}

    def close(self) -> None:
        """Stop launched servers, drop the weight directory and the thread pool (bind starts them again)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._nccl is not None:
            for eng in self._nccl.values():
                try:
                    eng.shutdown()
                except Exception as exc:  # noqa: BLE001 - best effort at teardown
                    _log.debug("NCCL weight-transfer shutdown failed: %s", exc)
            self._nccl = None
        if self._lora is not None and self.pool is not None and not self._procs:
            self._lora.release(self.pool)  # servers by URL outlive us: take our adapter off them
        self._lora = None
        for p in self._procs:
            p.stop()
        self._procs = []
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._sync_dir is not None and self.sync_dir_arg is None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)
        self._sync_dir = None

    def teardown(self) -> None:
        self.close()

    def __del__(self):  # launched servers never outlive a forgotten engine (the launcher also watches us)
        try:
            if self._procs:
                self.close()
        except Exception as exc:  # noqa: BLE001 - interpreter shutdown
            _log.debug("VLLMServerEngine cleanup failed: %s", exc)

    # --------------------------------------------------------------- generate
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        """``n`` completions per prompt (token ids), each recording the policy version it was sampled with.

        Shapes:
            prompt_ids: P lists of token ids. Returns P lists of ``n`` Completions with
            ``len(token_ids) == len(logprobs) <= max_new_tokens``; a prompt over the context raises.
        """
        if self.pool is None:
            raise RuntimeError("VLLMServerEngine is not started: call bind(module) first (RolloutCallback.setup does)")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.check_request_shape(n, sampling.max_new_tokens)
        with self._lock:
            if self._needs_initial_sync and self._module is not None:
                self._sync(self.sync_items(self._module.model))
                self._needs_initial_sync = False
            if self._stale is not None:
                raise RuntimeError(f"VLLMServerEngine refuses to generate: {self._stale}. Call update_weights again.")
            sent = check_prompts(prompt_ids, sampling.max_new_tokens, self.max_model_len, "VLLMServerEngine")
            version = self.policy_version
            bodies = [self._body(ids, n, sampling) for ids in sent]
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="lit_rl-server-req")
            futures = [self._executor.submit(self.pool.complete, b, n) for b in bodies]
            result: list[list[Completion]] = [[] for _ in prompt_ids]
            decode = lambda toks: self.tokenizer.decode(toks, skip_special_tokens=True)
            for i, fut in enumerate(futures):
                result[i] = [Completion(*cut_at_stop(t, lp, fr, decode, sampling.stops), version)
                             for t, lp, fr in fut.result()]
            return self._count(result)

    def _body(self, ids: list[int], n: int, sp: SamplingConfig) -> dict:
        model = {"model": self._lora.current} if self._lora is not None else {}  # else the pool's base model
        return {**model, "prompt": ids, **sampling_fields(sp, n, self._next_seed(sp, n)),
                "return_token_ids": True, "skip_special_tokens": False}

    def metrics(self) -> dict[str, float]:
        """Cumulative failure counts, per server i (in ``urls`` / launch order) the group requests it answered
        for this engine (``rollout/server{i}_requests``), and which sync path runs with its bytes per sync
        (logged by RolloutCallback every step)."""
        pool = self.pool
        out = {**super().metrics(), "rollout/server_errors": float(pool.errors if pool else 0),
               "rollout/retries": float(pool.retries if pool else 0),
               "rollout/prefix_cache_reset_retries": float(pool.cache_reset_retries if pool else 0),
               "rollout/servers_alive": float(sum(s.alive for s in pool.servers) if pool else 0),
               "rollout/weight_sync_adapter": float(self.sync_path == "adapter"),
               "rollout/weight_sync_bytes": float(self.last_sync_bytes)}
        for i, s in enumerate(pool.servers if pool else []):
            out[f"rollout/server{i}_requests"] = float(s.served)
        return out

    # ----------------------------------------------------------- weight sync
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Push new weights (``sync_items(model)``: merged checkpoint names, or the adapter's on the adapter
        path) to every live server.

        Raises ``ValueError`` on missing / unknown names (servers untouched); ``RuntimeError`` when any server
        fails to load them or reports another version, ``TimeoutError`` after ``sync_timeout_s``; after those
        two ``generate`` refuses until a later sync succeeds (no server serves stale weights silently).
        """
        with self._lock:
            self._sync(named_tensors)
            self._needs_initial_sync = False
            self.policy_version += 1

    def _sync(self, named_tensors) -> None:
        import torch.distributed as dist

        t0 = time.perf_counter()
        self._sync_seq += 1
        version = str(self._sync_seq)
        rank0 = self._group is None or dist.get_rank() == 0
        err: BaseException | None = None
        bad_names = False  # rank 0 refused the names: servers untouched, every rank raises ValueError
        if rank0:
            try:
                items = list(named_tensors)
                try:
                    check_weight_names(items, self._expected_names)
                except ValueError as exc:
                    raise ValueError(f"{exc} (sync path: {self.sync_path} weights; pass engine.sync_items(model))")
                if self._lora is not None:
                    self._lora.push(self.pool, items, version, self._ensure_sync_dir(), self.sync_timeout_s)
                    self.last_sync_bytes = self._lora.bytes_written
                elif self.weight_transport == "file":
                    path = write_weights_file(items, self._ensure_sync_dir())
                    self.last_sync_bytes = os.path.getsize(path)
                    self.pool.reload_from_file(self._sync_dir, version, self.sync_timeout_s)
                else:
                    self._sync_nccl(items, version)
            except ValueError as exc:  # told to the other ranks too: raising here would leave them in the broadcast
                err, bad_names = exc, True
            except BaseException as exc:  # noqa: BLE001 - reported below (and to the other ranks)
                err = exc
        if self._group is not None:  # rank 0 tells the others how it went; they then check the version
            box = [None if err is None else (bad_names, f"{type(err).__name__}: {err}")]
            dist.broadcast_object_list(box, src=0, group=self._group)
            if box[0] is not None and err is None:
                bad_names = box[0][0]
                err = (ValueError if bad_names else RuntimeError)(f"rank 0 failed the weight sync: {box[0][1]}")
            if err is None and not rank0:
                try:
                    self.pool.check_versions(version)
                    if self._lora is not None:
                        self._lora.check(self.pool, version)
                except BaseException as exc:  # noqa: BLE001
                    err = exc
        if bad_names:  # nothing was pushed: the sequence number is not used, the servers are not stale
            self._sync_seq -= 1
            raise err
        if err is not None:
            self._stale = f"the last weight sync failed ({type(err).__name__}: {err})"
            if isinstance(err, TimeoutError):
                raise err
            raise RuntimeError(f"VLLMServerEngine weight sync (version {version}) failed: {err}") from err
        self._stale = None
        self.last_sync_s = time.perf_counter() - t0

    def _sync_nccl(self, items, version: str) -> None:
        """Transport (b): one NCCL group per server (trainer rank 0 + that server's workers), vLLM's own
        trainer-side engine broadcasting each tensor; then the version is set and checked like transport (a)."""
        import torch

        from lit_rl.rollout._server_http import nccl_engines

        items = [(n, t.detach().to("cuda", non_blocking=True)) for n, t in items]  # NCCL sends device tensors
        torch.cuda.synchronize()
        source = _items_source(items)
        if self._nccl is None:
            self._nccl = nccl_engines(self.pool, source, self.sync_timeout_s)
        for eng in self._nccl.values():
            eng.source = source
            eng.send_weights()
        self.pool.set_versions(version)


def _items_source(items):
    """A vLLM ``WeightSource`` over one sync's (name, tensor) list (re-iterable, metadata without copies)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class ItemsSource(WeightSource):
        def metadata(self):
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in items]

        def __iter__(self):
            return iter(items)

    return ItemsSource()


def _policy_info(module) -> dict:
    cfg = getattr(module.model, "config", None)
    path = str(getattr(module, "model_path", "") or "")
    return {"architectures": list(getattr(cfg, "architectures", None) or architectures(path)),
            "vocab_size": getattr(cfg, "vocab_size", None), "path": path}


def _ddp_group():
    """A gloo group of all ranks when torch.distributed runs with several ranks (else None). Its own group,
    so weight-sync messages never interleave with the strategy's gradient collectives."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist.new_group(backend="gloo")

