"""The tokenizers of the tiny local models (``lit_rl.models.tiny``): a one-token-per-character kind and a
byte-level BPE kind, both with the same special tokens and a ChatML template.

Separate from ``tiny`` (which builds and saves the model directory) because a tokenizer is built on its own by
tests and tools, and its byte-level pipeline is the part that must agree with every loader; ``tiny`` re-exports
every public name here, and that is the documented path to import them from.

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
"""

from __future__ import annotations

import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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
