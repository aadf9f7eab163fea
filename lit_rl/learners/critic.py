"""`CriticModule`: PPO's value function V(s_t), by default a head on the policy's own backbone.

PPO (arXiv 1707.06347) for language models needs per-token values for GAE (arXiv 1506.02438). Most
trainers (veRL, OpenRLHF) run the critic as a second full model; sharing the policy's backbone instead
costs one linear layer (``head="regression"``) or nothing at all (``head="token"``: the model is asked a
question after each prefix — "is this trajectory good?" — and the value is its renormalised probability of
answering "yes", P(yes) / (P(yes) + P(no))), and one forward pass yields both the policy logits and the values
(the token head adds one cached pass over the question tokens).

The critic plugs into ``PolicyModule(critic=...)`` as one of the module's own loss terms
(``own_loss_terms``), a ``LossTerm`` like the ``ReferenceKL`` callback (``learners/protocols.py``): ``bind``
builds the head against the policy, ``needs`` asks the shared forward for the hidden states or the cache it
reads, ``on_experience`` fills ``Experience.values`` before advantages, ``loss_terms`` adds ``vf_coef ·``
value loss to every micro-batch, ``trains_alone`` is the value-only warmup, ``advantage_metrics`` reports the
explained variance of the rollout values against the returns, ``bootstrap_rows`` feeds GAE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from lit_rl.core.settings import check_choices, flat_settings, setting, split_settings
from lit_rl.core.value import bce_value_loss, clipped_value_loss, explained_variance, yes_no_value
from lit_rl.learners.config import PrecisionSettings
from lit_rl.learners.optim_step import LossParts
from lit_rl.learners.protocols import ForwardNeeds, LossTerm

HEADS = ("regression", "token")


@dataclass(frozen=True, kw_only=True)
class CriticSettings:
    """``CriticModule``'s settings: the one declaration of each (``flat_settings`` makes its signature)."""

    head: str = setting(
        "regression",
        "regression: Linear(hidden, 1) on the last hidden state, (clipped) squared error; "
        "token: V = lo + (hi - lo) * sigmoid(z_yes - z_no) of the LM's answer to question after each prefix, "
        "binary cross-entropy, read from the forward's cache (no new parameters; see the module doc).",
        choices=HEADS,
    )
    share_backbone: bool = setting(
        True,
        "The policy's backbone (one forward for logits and values); false = a separate causal LM "
        "loaded from model (or the policy's path), trained alongside it.",
    )
    model: str | None = setting(
        None,
        "The separate critic's weights; with share_backbone it may only name a model of the policy's "
        "architecture (so one interpolated path serves both), its weights unused.",
    )
    vf_coef: float = setting(0.5, "Weight of the value loss in the joint loss.")
    value_clip: float | None = setting(
        0.2, "PPO2 value clipping epsilon around the rollout values (regression only); null = off."
    )
    detach_backbone: bool = setting(
        False,
        "Stop the value loss's gradient at the backbone (only the head learns; a token head then "
        "learns a zero-initialised vector delta: z = h_q . (w_yes - w_no + delta), its yes/no rows frozen).",
    )
    yes_token: str = setting(" yes", "The token head's single 'yes' token.")
    no_token: str = setting(" no", "The token head's single 'no' token.")
    value_range: tuple[float, float] = setting(
        (0.0, 1.0), "[lo, hi] the token head maps onto; returns outside it raise ValueError."
    )
    warmup_steps: int = setting(
        0,
        "The first this many RL iterations train the value loss only (every other loss term times 0), so "
        "the policy's first advantages come from a fitted critic.",
    )
    init_from: str | None = setting(
        None, "A directory written by CriticPretrainModule.save: the head starts from its critic.pt."
    )
    bootstrap_truncated: bool = setting(
        False,
        "GAE on a completion cut by the generation budget (finish reason length) continues from its "
        "last state's value instead of ending the episode there (V = 0).",
    )
    question: str = setting(
        "\nIs this trajectory good? Answer:", "The text the token head appends after each prefix."
    )


@flat_settings((CriticSettings, PrecisionSettings), before=0)
class CriticModule(nn.Module, LossTerm):
    """A value head for PPO: a loss term of ``PolicyModule(critic=...)`` (see the module doc).

    Args:
    """  # noqa: D414 - flat_settings appends each setting's doc to this Args section

    settings_groups: ClassVar[tuple[type, ...]]  # set by @flat_settings

    def __init__(self, **settings: Any):
        super().__init__()
        s, precision = split_settings("CriticModule", CriticModule.settings_groups, settings)
        check_choices(s)
        check_choices(precision)
        if not s.vf_coef >= 0:
            raise ValueError(f"vf_coef must be >= 0, got {s.vf_coef}")
        if s.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {s.warmup_steps}")
        if s.value_clip is not None and not s.value_clip > 0:
            raise ValueError(f"value_clip must be > 0 or null, got {s.value_clip}")
        lo, hi = (float(x) for x in s.value_range)
        if not lo < hi:
            raise ValueError(f"value_range must be [lo, hi] with lo < hi, got {list(s.value_range)}")
        if s.head == "token" and not s.question:
            raise ValueError(
                "question must be a non-empty text for head='token' (it is asked after every prefix)"
            )
        # the names the value code reads (value_range as floats)
        self.head_type, self.share_backbone, self.model_path = s.head, s.share_backbone, s.model
        self.warmup_steps, self.init_from = s.warmup_steps, s.init_from
        self.bootstrap_truncated = bool(s.bootstrap_truncated)
        self.question = s.question
        self.question_ids: Tensor | None = None
        self.delta: nn.Parameter | None = None
        self.vf_coef, self.value_clip, self.detach_backbone = s.vf_coef, s.value_clip, s.detach_backbone
        self.yes_token, self.no_token, self.value_range = s.yes_token, s.no_token, (lo, hi)
        self.dtype = precision.dtype
        self.head: nn.Linear | None = None
        self.backbone: Any = None  # the critic's own causal LM (transformers) unless it shares the policy's
        self.token_ids: tuple[int, int] | None = None

    # ------------------------------------------------------------------ setup
    def bind(self, policy) -> None:
        """Build the head against ``policy`` (called by ``PolicyModule.__init__``)."""
        if self.share_backbone:
            if self.model_path is not None:
                _check_same_architecture(self.model_path, policy.model.config)
            config, tokenizer = policy.model.config, policy.tokenizer
        else:
            from lit_rl.models.loading import load_causal_lm, load_tokenizer

            path = self.model_path or policy.model_path
            self.backbone = load_causal_lm(path, self.dtype).train()
            if policy.config.forward.disable_dropout:
                from lit_rl.models.dropout import disable_dropout

                disable_dropout(self.backbone)
            config, tokenizer = self.backbone.config, load_tokenizer(path)
        if self.head_type == "regression":
            self.head = nn.Linear(config.hidden_size, 1)  # float32: values are regressed in full precision
            # Zero init: V ≡ 0 at the start, so the first advantages are the rewards themselves and the value
            # loss sends no gradient into a shared backbone until the head has learned something. A random head
            # gives |V| ~ 1 on normalised hidden states: wrong answers then get positive advantages wherever
            # V < 0, which drove PPO's entropy to collapse within 40 iterations on the quickstart task.
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        else:
            self.token_ids = _single_token_ids(tokenizer, self.yes_token, self.no_token)
            q = tokenizer.encode(self.question, add_special_tokens=False)
            if not q:
                raise ValueError(f"question={self.question!r} encodes to no tokens with this tokenizer")
            self.question_ids = torch.tensor(q, dtype=torch.long)
            if self.detach_backbone:
                self.delta = nn.Parameter(torch.zeros(config.hidden_size))
        if self.init_from is not None:
            from pathlib import Path

            f = Path(self.init_from) / "critic.pt"
            if not f.exists():
                raise FileNotFoundError(
                    f"init_from={self.init_from!r}: no {f.name} there (write it with "
                    "CriticPretrainModule.save)"
                )
            missing, unexpected = self.load_state_dict(torch.load(f, map_location="cpu"), strict=False)
            if unexpected or any(not k.startswith("backbone.") for k in missing):
                raise ValueError(
                    f"init_from={self.init_from!r}: {f.name} does not fit this critic "
                    f"(missing {missing}, unexpected {unexpected}); same head type?"
                )

    def needs(self) -> ForwardNeeds:
        """On a shared backbone, the policy's forward returns what the head reads: the hidden states
        (regression) or its key/value cache (the token head asks its question from it). An own backbone runs
        its own forward."""
        return ForwardNeeds(
            hidden=self.share_backbone and self.head_type == "regression",
            cache=self.share_backbone and self.head_type == "token",
        )

    # ---------------------------------------------------------------- values
    def _model(self, module):
        return module.model if self.share_backbone else self.backbone

    def predict(self, module, micro, fwd: dict[str, Any] | None = None) -> tuple[Tensor, Tensor]:
        """Per-token ``(values, raw)`` for a micro-batch, both (b, C).

        ``raw`` is what the loss acts on: the value itself (regression) or the logit z = z_yes − z_no (token).
        Reuses ``fwd["hidden"]`` (regression) or ``fwd["cache"]`` (token) of the policy's forward when the
        backbone is shared; ``fwd["question_logits"]`` (b, C, V), when given, are taken as the logits after the
        question (hand-computed tests).
        """
        fwd = fwd if (fwd is not None and self.share_backbone) else {}
        if self.head_type == "regression":
            hidden = fwd.get("hidden")
            if hidden is None:
                hidden = module.forward_outputs(micro, self.backbone, hidden=True)["hidden"]
            h = hidden.detach() if self.detach_backbone else hidden
            assert self.head is not None  # bind built it (head='regression')
            v = self.head(h.to(self.head.weight.dtype)).squeeze(-1)  # (b, C, 1) -> (b, C)
            return v, v
        assert self.token_ids is not None  # bind set it (head='token')
        if fwd.get("question_logits") is not None:
            yes, no = self.token_ids
            z = fwd["question_logits"][..., yes] - fwd["question_logits"][..., no]
        else:
            cache = fwd.get("cache")
            if cache is None:
                cache = module.forward_outputs(micro, self.backbone, cache=True)["cache"]
            z = self._question_logit(module, micro, cache)
        z = z.to(torch.promote_types(z.dtype, torch.float32))  # bf16 logits: the value in >= fp32
        lo, hi = self.value_range
        return lo + (hi - lo) * yes_no_value(z, torch.zeros_like(z)), z

    def _question_logit(self, module, micro, cache) -> Tensor:
        """z_t = logit(yes) − logit(no) after ``question`` appended to each prefix s_t, (b, C).

        One pass over C copies of the k question tokens on top of the sequence's cache: copy t attends to the
        real tokens at positions ≤ P+t−1 (s_t) and causally to its own question tokens, with positions
        continuing s_t's. Same values as C separate forwards of s_t + question (tested), C·k query tokens.
        """
        model = self._model(module)
        dev = next(model.parameters()).device
        b, L = micro.input_ids.shape
        P, C = micro.prompt_len, micro.completion_len
        assert self.question_ids is not None and self.token_ids is not None  # bind set them (head='token')
        q = self.question_ids.to(dev)
        k = len(q)
        att = micro.attention_mask.to(dev).bool()
        pos = (att.long().cumsum(-1) - 1).clamp(min=0)  # (b, L), as the main forward
        last = torch.arange(C, device=dev) + P - 1  # (C,) last position of s_t
        see_prefix = (torch.arange(L, device=dev)[None, :] <= last[:, None])[None] & att[
            :, None, :
        ]  # (b, C, L)
        copy = torch.arange(C * k, device=dev) // k
        j = torch.arange(C * k, device=dev) % k
        see_own = (copy[:, None] == copy[None, :]) & (j[None, :] <= j[:, None])  # (Ck, Ck) causal per copy
        allowed = torch.cat([see_prefix.repeat_interleave(k, dim=1), see_own.expand(b, -1, -1)], dim=-1)
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
        qpos = pos[:, last].repeat_interleave(k, dim=1) + 1 + j[None, :]  # (b, Ck)
        kw = {
            "input_ids": q.repeat(C).expand(b, -1),
            "attention_mask": mask[:, None],
            "position_ids": qpos,
            "past_key_values": cache,
            "use_cache": True,
            "logits_to_keep": torch.arange(k - 1, C * k, k, device=dev),
        }
        yes, no = self.token_ids
        if self.delta is None:
            logits = model(**kw).logits  # (b, C, V): the last question token of each copy
            return logits[..., yes] - logits[..., no]
        out_emb = model.get_output_embeddings()
        seen: dict[str, Tensor] = {}
        hook = out_emb.register_forward_hook(lambda m, inp, out: seen.__setitem__("h", inp[0]))
        try:
            with torch.no_grad():
                model(**kw)
        finally:
            hook.remove()
        h = seen["h"]  # (b, C, H) the LM head's input at the answer positions, no gradient to the backbone
        w = (out_emb.weight[yes] - out_emb.weight[no]).detach()
        z = h @ (w.to(h.dtype) + self.delta.to(h.dtype))
        if getattr(out_emb, "bias", None) is not None:
            z = z + (out_emb.bias[yes] - out_emb.bias[no]).detach()
        return z

    def on_experience(self, trainer, module, exp) -> None:
        """ExperienceHook: the rollout values ``exp.values`` before advantages (``attach_values``)."""
        self.attach_values(module, exp)

    def bootstrap_rows(self, exp) -> Tensor | None:
        """(B,) bool: rows whose GAE continues from the last state's value (cut off by the budget, finish
        reason ``length``) when ``bootstrap_truncated``; None = none."""
        if not self.bootstrap_truncated or not exp.finish_reasons:
            return None
        return torch.tensor([f == "length" for f in exp.finish_reasons], dtype=torch.bool)

    def trains_alone(self, module) -> bool:
        """During the first ``warmup_steps`` iterations only the value loss trains (the module multiplies every
        other loss part by 0)."""
        return module.iteration < self.warmup_steps

    @torch.no_grad()
    def attach_values(self, module, exp) -> None:
        """``exp.values`` (B, C) float32: V at every completion token (0 off the loss mask)."""
        chunks = []
        for micro in exp.micro_batches(module.config.step.micro_batch_size):
            v, _ = self.predict(module, micro)
            v = v.double() if v.dtype == torch.float64 else v.float()
            chunks.append(torch.where(micro.loss_mask.to(v.device), v, 0.0).to(exp.input_ids.device))
        exp.values = torch.cat(chunks)  # (B, C)

    # ------------------------------------------------------------------ loss
    def loss_terms(self, module, micro, fwd: dict[str, Any]) -> dict[str, Tensor]:
        """``{"value": vf_coef · agg(L_t)}`` with the module's aggregation.

        A LossTerm (docs/architecture.md "Contracts")."""
        if micro.returns is None or micro.values is None:
            raise RuntimeError(
                "CriticModule needs Experience.values and .returns: use a return-producing advantage "
                "estimator (advantage='gae' or 'reinforce') with PolicyModule(critic=...)"
            )
        mask = fwd["mask"]
        v, raw = self.predict(module, micro, fwd)
        returns = micro.returns.to(v.device)
        metrics = {}
        if self.head_type == "regression":
            per_token, m = clipped_value_loss(v, micro.values.to(v), returns.to(v), mask, self.value_clip)
            metrics["critic/vf_clipfrac"] = m["vf_clipfrac"]
        else:
            lo, hi = self.value_range
            try:
                per_token = bce_value_loss(raw, (returns.to(raw) - lo) / (hi - lo), mask)
            except ValueError as e:
                raise ValueError(f"token value head: returns must lie in value_range={[lo, hi]} ({e})") from e
        value_loss = module.aggregate(per_token, mask, fwd)
        # The metrics ride on the loss parts: OptimizerStep folds those of real micro-batches only (a zero-weight
        # padding pass, run so ranks' collectives stay in step, is no value-loss sample) and PolicyModule logs
        # them. ``value_loss`` is this micro-batch's share (minibatch denominators), so it is summed over the
        # step like ``loss/value``: the minibatch's value loss, whatever the micro-batching.
        return LossParts(
            {"value": self.vf_coef * value_loss},
            metrics,
            shares={"critic/value_loss": float(value_loss.detach())},
        )

    def advantage_metrics(self, exp) -> dict[str, float]:
        """Explained variance of the rollout values against the returns, over the trainable tokens (invalid rows
        have no return: they are no value target)."""
        if exp.values is None or exp.returns is None:
            return {}
        m = exp.train_mask
        return {
            "critic/explained_variance": explained_variance(exp.values, exp.returns, m),
            "critic/values_mean": float(exp.values[m].mean()) if m.any() else 0.0,
        }


def _single_token_ids(tokenizer, yes: str, no: str) -> tuple[int, int]:
    ids, bad = [], []
    for tok in (yes, no):
        enc = tokenizer.encode(tok, add_special_tokens=False)
        if len(enc) != 1:
            bad.append(f"{tok!r} -> {len(enc)} tokens {enc}")
        ids.append(enc[0] if enc else -1)
    if bad:
        raise ValueError(
            "token value head needs yes_token and no_token to be single tokens of the tokenizer; "
            f"not single tokens: {'; '.join(bad)}"
        )
    if ids[0] == ids[1]:
        raise ValueError(f"yes_token {yes!r} and no_token {no!r} map to the same token id {ids[0]}")
    return ids[0], ids[1]


def _check_same_architecture(path: str, policy_config) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
    mine = {k: getattr(cfg, k, None) for k in keys}
    theirs = {k: getattr(policy_config, k, None) for k in keys}
    if mine != theirs:
        raise ValueError(
            f"share_backbone=True but critic model {path!r} has architecture {mine}, the policy has "
            f"{theirs}; use share_backbone=False for a critic of another architecture"
        )
