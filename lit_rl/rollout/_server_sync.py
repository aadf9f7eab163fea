"""Weight push of `VLLMServerEngine` (``update_weights`` → ``_sync``), split from ``rollout/server.py`` by concern.

Transport ``file``: rank 0 writes one safetensors file (or the LoRA adapter, ``_server_lora``) and every live
server reloads it, resets its prefix cache and must report the new version; transport ``nccl``: vLLM's
weight-transfer engine per server. With DDP ranks sharing servers by URL the push is a collective on the
engine's own gloo group: barrier, rank 0 pushes, broadcast of the outcome, the other ranks check the version.
"""

from __future__ import annotations

import collections
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from lit_rl.rollout._vllm_common import check_weight_names, make_sync_dir, write_weights_file

if TYPE_CHECKING:
    from lit_rl.rollout._server_http import Server, ServerPool
    from lit_rl.rollout._server_lora import AdapterSync


class WeightPush:
    """``_sync`` / ``_sync_nccl`` of ``VLLMServerEngine`` (a mixin: they read and set the engine's state, declared
    here and set in ``VLLMServerEngine.__init__`` / ``bind``)."""

    weight_transport: str  # "file" | "nccl"
    sync_timeout_s: float
    sync_dir_arg: str | None  # the user's sync_dir (None: a fresh one in /dev/shm)
    sync_path: str | None  # "adapter" | "merged", chosen at bind
    last_sync_bytes: int
    last_sync_s: float
    pool: ServerPool | None  # None until bind
    _lora: AdapterSync | None  # the adapter path's state (None: merged weights)
    _expected_names: set[str] | None  # the parameter names a sync must carry (set at bind)
    _sync_seq: int  # syncs pushed to the servers; the version string they must report
    _sync_dir: str | None
    _push_dir: str | None  # the last sync's files (rank 0's sync dir, also on the other ranks)
    _stale: str | None  # why generate refuses (the last sync failed), else None
    _group: Any  # torch.distributed ProcessGroup of the DDP ranks sharing the servers, or None
    _nccl: dict[str, Any] | None  # vLLM trainer-side weight-transfer engine per server URL (transport nccl)

    def _bound_pool(self) -> ServerPool:
        """The server pool; a sync before ``bind`` is a caller error."""
        if self.pool is None:
            raise RuntimeError(
                "VLLMServerEngine is not started: call bind(module) first (RolloutCallback.setup does)"
            )
        return self.pool

    def _ensure_sync_dir(self) -> str:
        if self._sync_dir is None:
            self._sync_dir = self.sync_dir_arg or make_sync_dir()
            os.makedirs(self._sync_dir, exist_ok=True)
        return self._sync_dir

    def _sync(self, named_tensors) -> None:
        import torch.distributed as dist

        t0 = time.perf_counter()
        # the names are checked before the pool is needed (a job's ranks must agree on a refusal even where the
        # pool is not up, tests/test_rank_failure.py), so a sync before bind fails at the first use of the pool
        pool = self.pool
        self._sync_seq += 1
        version = str(self._sync_seq)
        rank0 = self._group is None or dist.get_rank() == 0
        if self._group is not None:
            # Every rank waits here with no request of its own in flight (generate holds self._lock for all of
            # its requests), so rank 0 never reloads the servers, resets their prefix cache or unloads an
            # adapter under another rank's running or queued requests, whose rows would carry the old version.
            dist.barrier(group=self._group)
        err: BaseException | None = None
        bad_names = False  # rank 0 refused the names: servers untouched, every rank raises ValueError
        if not rank0:
            # Every rank iterates the weights, in the same order, though only rank 0 sends them: sharded weights
            # (FSDP2 DTensors, ZeRO-3 partitions) are gathered by one collective per parameter as the generator
            # (``merged_state_items``) is iterated, and a rank skipping it left rank 0 in the first gather and
            # itself in the broadcast below, until the process-group timeout (issue 36).
            try:
                collections.deque(named_tensors, maxlen=0)
            except BaseException as exc:  # noqa: BLE001 - reported after rank 0's outcome, below
                err = exc
        if rank0:
            try:
                items = list(named_tensors)  # the gathers every other rank joins just above
                try:
                    check_weight_names(items, self._expected_names)
                except ValueError as exc:
                    raise ValueError(
                        f"{exc} (sync path: {self.sync_path} weights; pass engine.sync_items(model))"
                    ) from None
                pool = self._bound_pool()
                if self._lora is not None:
                    self._lora.push(pool, items, version, self._ensure_sync_dir(), self.sync_timeout_s)
                    self.last_sync_bytes = self._lora.bytes_written
                elif self.weight_transport == "file":
                    sync_dir = self._ensure_sync_dir()
                    path = write_weights_file(items, sync_dir)
                    self.last_sync_bytes = os.path.getsize(path)
                    pool.reload_from_file(sync_dir, version, self.sync_timeout_s)
                else:
                    self._sync_nccl(items, version)
            except (
                ValueError
            ) as exc:  # told to the other ranks too: raising here would leave them in the broadcast
                err, bad_names = exc, True
            except BaseException as exc:  # noqa: BLE001 - reported below (and to the other ranks)
                err = exc
        if self._group is not None:  # rank 0 tells the others how it went; they then check the version
            # (and the servers it synced: one it dropped as gone is dropped on every rank)
            box: list[Any] = [
                None if err is None else (bad_names, f"{type(err).__name__}: {err}"),
                [s.url for s in pool.servers if s.alive] if rank0 and pool is not None else None,
                self._sync_dir if rank0 else None,
            ]
            dist.broadcast_object_list(box, src=0, group=self._group)
            self._push_dir = box[
                2
            ]  # where this sync's files are (the servers read them): ``_resync_restarted``
            if box[0] is not None and err is None:
                bad_names = box[0][0]
                err = (ValueError if bad_names else RuntimeError)(
                    f"rank 0 failed the weight sync: {box[0][1]}"
                )
            if err is None and not rank0:
                try:
                    pool = self._bound_pool()
                    if box[1] is not None:
                        pool.keep_alive_only(box[1], f"rank 0 dropped it in weight sync {version}")
                    pool.check_versions(version)
                    if self._lora is not None:
                        self._lora.check(pool, version)
                except BaseException as exc:  # noqa: BLE001
                    err = exc
        if bad_names and err is not None:  # nothing was pushed: the sequence number is not used, the servers
            # are not stale
            self._sync_seq -= 1
            raise err
        if err is not None:
            self._stale = f"the last weight sync failed ({type(err).__name__}: {err})"
            if isinstance(err, TimeoutError):
                raise err
            raise RuntimeError(f"VLLMServerEngine weight sync (version {version}) failed: {err}") from err
        self._stale = None
        if self._group is None:
            self._push_dir = self._sync_dir
        self.last_sync_s = time.perf_counter() - t0

    def _resync_restarted(self) -> None:
        """Before each generate round (engine lock held): a live server that does not report the last sync's
        weight version was restarted since (it holds its base weights) or synced by another client, and its
        rows would carry our version's label falsely; it is given our weights again (``_push_again``) or
        dropped (``ServerPool.resync``). The pool checks the version after every answer of the round as well
        (``ServerPool.complete``), with the same remedy."""
        pool = self._bound_pool()
        for s in pool.unsynced(str(self._sync_seq)):  # generate set pool.expected to it
            pool.resync(s)

    def _push_again(self, s: Server) -> str:
        """The last sync's weights onto server ``s`` alone, under a version never used before (``"N+<token>"``,
        returned), which the server must then report (or another resync's of sync N: ``_server_http._ours``);
        raises when that cannot be done. The fresh version is what lets every rank see that the server's weights
        were reloaded under its requests in flight (``ServerPool.complete``). With transport ``file`` the weights
        are still in the sync directory until the next sync (merged weights: reload; adapter path: the current
        adapter); any rank can do this (the servers read the files; two ranks re-pushing the same files
        concurrently load the same weights). Transport ``nccl``: the tensors are gone, so it raises and the
        server is dropped."""
        from lit_rl.rollout._server_http import ServerError

        pool = self._bound_pool()
        version = str(self._sync_seq)
        if self.weight_transport != "file" or self._push_dir is None:
            raise ServerError(
                f"reports weight version {s.why_unsynced}, not {version!r} (restarted or synced by another "
                f"client) and transport {self.weight_transport} cannot push the last weights again"
            )
        label = f"{version}+{uuid.uuid4().hex[:8]}"
        if self._lora is not None:
            self._lora.reload(pool, s, version, self._push_dir, self.sync_timeout_s, label=label)
        else:
            pool.reload_one(s, self._push_dir, label, self.sync_timeout_s)
        return label

    def _sync_nccl(self, items, version: str) -> None:
        """Transport (b): one NCCL group per server (trainer rank 0 + that server's workers), vLLM's own
        trainer-side engine broadcasting each tensor; then the version is set and checked like transport (a)."""
        import torch

        from lit_rl.rollout._server_http import nccl_engines

        pool = self._bound_pool()
        items = [(n, t.detach().to("cuda", non_blocking=True)) for n, t in items]  # NCCL sends device tensors
        torch.cuda.synchronize()
        source = _items_source(items)
        if self._nccl is None:
            self._nccl = nccl_engines(pool, source, self.sync_timeout_s)
        for eng in self._nccl.values():
            eng.source = source
            eng.send_weights()
        pool.set_versions(version)


def _items_source(items):
    """A vLLM ``WeightSource`` over one sync's (name, tensor) list (re-iterable, metadata without copies)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class ItemsSource(WeightSource):
        def metadata(self):
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in items]

        def __iter__(self):
            return iter(items)

    return ItemsSource()


def _ddp_group():
    """A gloo group of all ranks when torch.distributed runs with several ranks (else None). Its own group,
    so weight-sync messages never interleave with the strategy's gradient collectives."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    return dist.new_group(backend="gloo")
