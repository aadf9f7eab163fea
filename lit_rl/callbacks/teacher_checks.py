"""Setup checks of a ``TeacherRouter``'s teachers (split from ``teachers.py``): a teacher that cannot be read
or whose tokenizer the student's losses cannot use is refused before any rollout, in one line naming the
teacher (``TeacherRouter.teachers.<domain> (<path>)``), what is wrong and the fix.
"""

from __future__ import annotations


def same_tokenizer(a, b) -> bool:
    return a is b or (len(a) == len(b) and a.get_vocab() == b.get_vocab())


def vocab_difference(tok, student) -> str | None:
    """What differs between two tokenizers' vocabularies, in words (None: identical)."""
    if same_tokenizer(tok, student):
        return None
    if len(tok) != len(student):
        return f"vocabularies of {len(tok)} vs the student's {len(student)} tokens"
    a, b = tok.get_vocab(), student.get_vocab()
    first = min(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])
    return f"vocabularies of the same size that differ from token id {first[1]} on"


def special_difference(tok, student) -> str | None:
    """The first of eos / bos whose id differs between two tokenizers of the same vocabulary (None: same)."""
    for name in ("eos", "bos"):
        t, s = getattr(tok, f"{name}_token_id"), getattr(student, f"{name}_token_id")
        if t != s:
            return (
                f"{name} token {getattr(tok, f'{name}_token')!r} (id {t}) vs the student's "
                f"{getattr(student, f'{name}_token')!r} (id {s})"
            )
    return None


def refuse_tokenizer(who: str, tok, student, full_vocab_loss: str | None) -> None:
    """Raise ``ValueError`` when teacher ``who``'s tokenizer ``tok`` cannot serve a student with tokenizer
    ``student``: another vocabulary under a loss comparing full distributions (``full_vocab_loss``; the
    sampled reverse KL re-tokenises the student's text instead), or the same vocabulary with another eos / bos
    (such a teacher is scored token for token: the student's stop would be an ordinary token to it)."""
    vocab = vocab_difference(tok, student)
    if vocab is not None and full_vocab_loss is not None:
        raise ValueError(
            f"{who}: its tokenizer differs from the student's ({vocab}), and loss {full_vocab_loss!r} "
            "compares full next-token distributions. Use losses: {reverse_kl_sampled: 1.0} (the student's "
            "text is re-tokenised for the teacher) or a teacher trained from the student's model"
        )
    special = special_difference(tok, student) if vocab is None else None
    if special is not None:
        raise ValueError(
            f"{who}: same vocabulary as the student but {special}; scored token for token, the student's "
            "stop would be an ordinary token to the teacher. If the teacher was trained from the student's "
            "model, save the student's tokenizer into the teacher's directory"
        )


def readable_teacher(source: str, who: str):
    """The tokenizer of a model directory / hub id, after checking that its config and weights can be read;
    any failure is one line naming the teacher (``who``) and what is wrong."""
    from pathlib import Path

    from transformers import AutoConfig

    from lit_rl.models.loading import is_adapter_dir, load_tokenizer

    fix = (
        "point it at a saved model directory (config.json, weights, tokenizer), e.g. an expert's final_model"
    )
    local = Path(source).expanduser()
    try:
        if not is_adapter_dir(source):  # an adapter's base was checked at construction
            AutoConfig.from_pretrained(source)
    except Exception as e:  # any unreadable config is refused the same way, with its reason
        raise ValueError(
            f"{who}: cannot be loaded, its config.json is unreadable ({_first_line(e)}); {fix}"
        ) from e
    weights = (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    )
    if local.is_dir() and not is_adapter_dir(source) and not any((local / w).exists() for w in weights):
        raise ValueError(
            f"{who}: cannot be loaded, the directory holds no weights ({' / '.join(weights)}); {fix}"
        )
    try:
        return load_tokenizer(source)
    except Exception as e:
        raise ValueError(f"{who}: cannot load its tokenizer ({_first_line(e)}); {fix}") from e


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_dtype(dtype: str | None, field: str) -> None:
    """A teacher dtype is checked when the teacher is declared, not at its first load mid-run."""
    from lit_rl.models.loading import DTYPES

    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"{field}={dtype!r}; valid values: {', '.join(DTYPES)}, or null (the student's)")
