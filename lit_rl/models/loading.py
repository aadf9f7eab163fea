"""Loading causal LMs and tokenizers (local path or hub id), optional LoRA through ``peft``."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}; valid values: {', '.join(DTYPES)}")
    return DTYPES[name]


# A Hugging Face hub id: "name" or "org/name" (letters, digits, - _ .), never starting with . / ~
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def is_hub_id(path: str) -> bool:
    """True for a string that can only be a hub id: it is no existing path and has the ``org/name`` shape."""
    return bool(_HUB_ID.match(path)) and not Path(path).expanduser().exists()


def check_model_source(path: str, field: str = "model") -> None:
    """Fail early for a model that can be neither loaded from disk nor looked up on the hub.

    An existing directory must hold a ``config.json``; a path that does not exist must be a hub id
    (``org/name`` or ``name``), which ``from_pretrained`` downloads; anything else (``runs/x/model``, ``./m``,
    ``/abs/path``) is a mistyped or missing local path and an error here, before any weights load.
    """
    if not path:
        raise ValueError(f"{field} is empty; pass a local model directory or a hub id")
    p = Path(path).expanduser()
    if (p / "config.json").exists():
        return
    if is_hub_id(path):
        _check_hub_reachable(path, field)
        return
    if (p / "adapter_config.json").exists():  # a PEFT adapter directory: its base model must be loadable
        check_model_source(
            adapter_base(path), f"{field} (the base_model_name_or_path of the adapter {path!r})"
        )
        return
    what = "holds no Hugging Face model (missing config.json)" if p.exists() else "does not exist"
    raise FileNotFoundError(
        f"{field}={path!r}: the local path {what}, and it is not a hub id (org/name). Pass a saved model "
        "directory or a hub id, or build a tiny local one: python -m lit_rl.models.tiny DIR"
    )


_HUB_UP: dict[str, bool] = {}  # endpoint -> reachable, probed once per process


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the hub's endpoint (HF_ENDPOINT, default huggingface.co:443). Without it,
    ``from_pretrained`` spends over a minute in retries before failing."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(constants.ENDPOINT)
    key = f"{url.hostname}:{url.port}"
    if key not in _HUB_UP:
        try:
            socket.create_connection(
                (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
            ).close()
            _HUB_UP[key] = True
        except OSError:
            _HUB_UP[key] = False
    return _HUB_UP[key]


def _check_hub_reachable(repo_id: str, field: str) -> None:
    """A hub id without network: use the local hub cache offline (no retries) when it holds the model, else
    fail now, naming the field, instead of after ``from_pretrained``'s retries."""
    if _hub_reachable():
        return
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        os.environ["HF_HUB_OFFLINE"] = "1"  # read by processes started later (workers, servers)
        constants.HF_HUB_OFFLINE = True  # read by this process's already imported hub client
        return
    raise OSError(
        f"{field}={repo_id!r} is not a local directory, so it is a Hugging Face hub id, but the hub "
        f"({constants.ENDPOINT}) is unreachable from here (no network access) and the model is not in the local "
        "hub cache. Download it where there is network access and pass its local directory instead."
    )


def _from_pretrained(loader, path: str, field: str = "model", **kw):
    """``loader.from_pretrained`` with a clear error when a hub id cannot be fetched (no network, no such
    repository): the local path did not exist, so the name was looked up on the hub."""
    try:
        return loader.from_pretrained(path, **kw)
    except OSError as e:
        if not is_hub_id(path):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OSError(
            f"{field}={path!r} is not a local directory, so it was loaded as a Hugging Face hub id, which failed "
            f"(no network access, or no such repository?): {first} Download the model where there is network "
            "access and pass its local directory instead."
        ) from None  # the cause's text is in the message


def adapter_base(path: str) -> str:
    """The base model of a PEFT adapter directory (``adapter_config.json``'s ``base_model_name_or_path``)."""
    import json

    cfg = json.loads((Path(path).expanduser() / "adapter_config.json").read_text())
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise ValueError(
            f"{path}/adapter_config.json has no base_model_name_or_path: which model does the adapter "
            "belong to?"
        )
    return base


def is_adapter_dir(path: str) -> bool:
    p = Path(path).expanduser()
    return (p / "adapter_config.json").exists() and not (p / "config.json").exists()


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    if is_adapter_dir(path) and not (Path(path).expanduser() / "tokenizer_config.json").exists():
        path = adapter_base(path)  # an adapter saved without its tokenizer: the base model's
    tok = _from_pretrained(AutoTokenizer, path)
    if tok.pad_token_id is None:  # many base models ship without one; eos is the usual stand-in
        tok.pad_token = tok.eos_token
    return tok


def check_adapter(
    adapter: str | None, model: str, lora: dict[str, Any] | None, field: str = "adapter"
) -> None:
    """``adapter`` (a PEFT adapter directory to start from) beside ``model`` (its base) and ``lora``: one source
    of LoRA settings, one adapter, and a directory that holds one. Checked before any weights load."""
    if adapter is None:
        return
    if not (Path(adapter).expanduser() / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"{field}={adapter!r}: not a PEFT adapter directory (no adapter_config.json); pass "
            "the directory `lit-rl export --adapter` or PeftModel.save_pretrained wrote"
        )
    if is_adapter_dir(model):
        raise ValueError(
            f"model={model!r} is itself a PEFT adapter directory and {field}={adapter!r} is another: "
            f"pass the base model as model (or drop {field})"
        )
    if lora:
        raise ValueError(
            f"{field}={adapter!r}: its adapter_config.json sets the LoRA settings; drop lora (or drop "
            f"{field} for a new adapter)"
        )


def load_causal_lm(
    path: str,
    dtype: str = "float32",
    lora: dict[str, Any] | None = None,
    attn_implementation: str | None = "sdpa",
    adapter: str | None = None,
):
    """Load a causal LM; with ``lora`` (peft LoraConfig kwargs, e.g. ``{r: 8, lora_alpha: 16}``) wrap it. With
    ``adapter`` (a PEFT adapter directory) the model at ``path`` is its base and the adapter goes on it,
    trainable: training continues from the adapter, whose own config applies (``lora`` must be unset). A PEFT
    adapter directory as ``path`` itself is the same with the base from its ``adapter_config.json``
    (``base_model_name_or_path``)."""
    from transformers import AutoModelForCausalLM

    check_model_source(path)
    check_adapter(adapter, path, lora)
    kw: dict[str, Any] = {"dtype": resolve_dtype(dtype)}
    if attn_implementation:
        kw["attn_implementation"] = attn_implementation
    if is_adapter_dir(path):
        if lora:
            raise ValueError(
                f"model={path!r} is a PEFT adapter directory, whose adapter_config.json sets the LoRA "
                "settings; drop lora (or pass the base model with lora for a new adapter)"
            )
        path, adapter = adapter_base(path), path
    if adapter is not None:
        from peft import PeftModel

        base = _from_pretrained(AutoModelForCausalLM, path, **kw)
        return PeftModel.from_pretrained(base, str(Path(adapter).expanduser()), is_trainable=True)
    model = _from_pretrained(AutoModelForCausalLM, path, **kw)
    if lora:
        from peft import LoraConfig, get_peft_model

        cfg = dict(lora)
        cfg.setdefault("task_type", "CAUSAL_LM")
        cfg.setdefault("target_modules", "all-linear")
        model = get_peft_model(model, LoraConfig(**cfg))
    return model


def merged_state_items(model):
    """(name, tensor) pairs of the plain (non-LoRA) model's weights, for syncing an engine.

    A LoRA-wrapped model is merged on the fly (W + BA·scale) without modifying the training model, and
    names are stripped of peft's prefixes so they match the base architecture's checkpoint names. Sharded
    weights (FSDP2 DTensors, ZeRO-3 partitions) are gathered with a collective per parameter, so every rank must
    iterate the whole generator.
    """
    state = model.state_dict(keep_vars=True)  # keep_vars: ZeRO-3 marks its partitioned Parameters (``ds_id``)
    sharded = any(hasattr(p, "ds_id") or hasattr(p, "full_tensor") for p in state.values())
    if _is_peft(model):
        if sharded:  # FSDP2 cannot be deep-copied and ZeRO-3 holds partitions: merge from gathered tensors
            yield from lora_merged_state(model, {n: full_tensor(p) for n, p in state.items()}).items()
            return
        import copy

        merged = copy.deepcopy(model).merge_and_unload()
        yield from ((n, p.detach()) for n, p in merged.state_dict().items())
        return
    for n, p in state.items():  # one full tensor at a time: the peak is one parameter, not the whole model
        yield n, full_tensor(p)


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a core dependency
        return False
    return isinstance(model, PeftModel)


def full_tensor(p):
    """The full, detached tensor of a parameter: an FSDP2 DTensor's ``full_tensor()``, a ZeRO-3 partition
    gathered by DeepSpeed (copied: the gathered storage is released when the block exits), else ``p`` itself.
    Sharded cases are collectives: every rank must call this for the same parameters in the same order."""
    if hasattr(p, "ds_id"):
        import deepspeed  # ``deepspeed.zero`` is an attribute of the package, not an importable module

        with deepspeed.zero.GatheredParameters([p]):
            return p.detach().clone()
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach()


def lora_merged_state(model, full: dict) -> dict:
    """The merged base-model state dict of PEFT LoRA ``model`` from its full (gathered) state dict ``full``:
    for each LoRA layer, W' = W + (B @ A) · scaling (transposed for ``fan_in_fan_out`` layers), the form
    ``merge_and_unload`` computes; names lose peft's ``base_model.model.`` prefix and ``.base_layer``; LoRA
    tensors are dropped. Works on plain tensors, so a sharded model merges without being copied."""
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    merged = {}
    for name, t in full.items():
        if ".lora_" in name or "modules_to_save" in name or "original_module" in name:
            if "modules_to_save" in name or "original_module" in name:
                raise NotImplementedError(f"merging LoRA modules_to_save ({name}) from gathered weights")
            continue
        out = name.removeprefix(prefix)
        layer_name, _, leaf = name.rpartition(".base_layer.")
        if layer_name in layers and leaf == "weight":
            m = layers[layer_name]
            (adapter,) = m.active_adapters
            if getattr(m, "use_dora", {}).get(adapter, False):
                raise NotImplementedError(f"merging a DoRA layer ({layer_name}) from gathered weights")
            a, b = (
                full[f"{layer_name}.lora_A.{adapter}.weight"],
                full[f"{layer_name}.lora_B.{adapter}.weight"],
            )
            ct = torch.promote_types(t.dtype, torch.float32)  # bf16 weights merge in float32, float64 stays
            delta = (b.to(ct) @ a.to(ct)) * m.scaling[adapter]  # (out, r) @ (r, in) = (out, in)
            if getattr(m, "fan_in_fan_out", False):
                delta = delta.T
            t = (t.to(ct) + delta).to(t.dtype)
        merged[out.replace(".base_layer.", ".")] = t
    return merged
