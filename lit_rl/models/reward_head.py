"""A scalar-head sequence classifier as a reward model: loading and scoring (used by ``RewardModelModule``, which
trains one, and by ``rewards.RewardModelReward``, which scores with one; here, below both)."""

from __future__ import annotations

from torch import Tensor

from lit_rl.models.loading import check_model_source, load_tokenizer, resolve_dtype


def load_reward_model(path: str, dtype: str = "float32"):
    """(model, tokenizer) of a scalar-head sequence classifier from a causal LM or a saved reward model."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    check_model_source(path)
    tok = load_tokenizer(path)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a causal LM has no `score` head yet: the "newly initialized" notice is expected
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=resolve_dtype(dtype), pad_token_id=tok.pad_token_id
        )
    finally:
        hf_logging.set_verbosity(level)
    return model, tok


def score_texts(model, tokenizer, texts: list[str], max_length: int | None = None) -> Tensor:
    """Scalar reward of each text, (N,) float32: the head's output at the last non-padding token.

    Right padding: the sequence classifier locates each row's last real token from the pad id.
    """
    dev = next(model.parameters()).device
    enc = tokenizer(
        texts,
        return_tensors="pt",
        padding=True,
        padding_side="right",
        truncation=max_length is not None,
        max_length=max_length,
        add_special_tokens=False,
    )
    out = model(input_ids=enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev))
    return out.logits[:, 0].float()  # (N,)
