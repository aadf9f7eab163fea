"""Teachers for on-policy distillation: `Teacher` (one frozen scorer) and `TeacherRouter` (one per domain).

A teacher scores the *student's* tokens with a teacher-forced forward over prompt + student completion
(on-policy distillation, GKD arXiv 2306.13649; MiniLLM arXiv 2306.08543). Three kinds:

* a model directory / hub id (loaded lazily, on the first row of its domain), or an in-memory model;
* ``source="self"``: the student's current weights under ``no_grad`` (on-policy self-distillation, OPSD);
* ``source="self_frozen"``: a frozen copy of the student taken at ``setup`` (before any update).

With ``template`` the teacher's prompt is rebuilt from the prompt record with privileged context, e.g.
``"{prompt}(answer: {answer})"``; the student's completion tokens are appended unchanged, so teacher and
student log-probs stay aligned token for token (Experience layout: entry t of every (B, C) field).
"""

from __future__ import annotations

import copy
import time
from types import SimpleNamespace
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch

from lit_rl.callbacks._learner import learner
from lit_rl.callbacks.teacher_checks import check_dtype, readable_teacher, refuse_tokenizer, same_tokenizer
from lit_rl.callbacks.teacher_inputs import cross_tokenizer_view, privileged_prompt, teacher_view
from lit_rl.core.distill import teacher_topk
from lit_rl.core.fused_logprobs import linear_logprobs
from lit_rl.core.logprobs import token_logprobs
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.learners.distill import DistillModule
from lit_rl.learners.policy import PolicyModule
from lit_rl.rollout.build import ExperienceBuilder, Rows

SELF_SOURCES = ("self", "self_frozen")


class Teacher:
    """One frozen teacher.

    Args:
        source: model directory / hub id, ``"self"`` (student's current weights, no_grad) or ``"self_frozen"``
            (copy of the student at setup). Ignored when ``model`` is given.
        template: privileged-context prompt template (``str.format`` fields from the prompt record); None keeps
            the student's prompt tokens.
        dtype: dtype of the teacher's weights, loaded from ``source`` or copied from the student for
            ``self_frozen`` (``bfloat16`` halves a float32 teacher's memory; default: the student's dtype).
        model, tokenizer: an in-memory teacher (Python API); ``tokenizer`` defaults to the student's.
    """

    def __init__(
        self,
        source: str = "self",
        template: str | None = None,
        dtype: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ):
        if model is None and not source:
            raise ValueError("Teacher: pass source (a model path / hub id, 'self' or 'self_frozen') or model")
        if model is None and source not in SELF_SOURCES:
            from lit_rl.models.loading import check_model_source

            check_model_source(source, "Teacher.source")
        check_dtype(dtype, "Teacher.dtype")
        self.source, self.template, self.dtype = source, template, dtype
        self.model, self.tokenizer = model, tokenizer

    @property
    def is_self(self) -> bool:
        return self.model is None and self.source in SELF_SOURCES

    def snapshot(self, module) -> None:
        """``self_frozen``: copy the student's weights now (called at setup, before any optimizer step)."""
        if self.model is None and self.source == "self_frozen":
            self.model = copy.deepcopy(module.model).eval().requires_grad_(False)
            if self.dtype:
                from lit_rl.models.loading import resolve_dtype

                self.model.to(resolve_dtype(self.dtype))
            self.tokenizer = module.tokenizer

    def get(self, module) -> tuple[torch.nn.Module, Any]:
        """(model, tokenizer), loading a path-based teacher on first use."""
        if self.model is None:
            if self.source == "self":
                return module.model, module.tokenizer
            if self.source == "self_frozen":
                self.snapshot(module)
            else:
                from lit_rl.models.loading import load_causal_lm, load_tokenizer

                self.model = load_causal_lm(self.source, self.dtype or module.config.precision.dtype)
                self.model.eval().requires_grad_(False)
                self.tokenizer = load_tokenizer(self.source)
        assert self.model is not None  # snapshotted or loaded just above
        return self.model, self.tokenizer or module.tokenizer

    @property
    def loaded(self) -> bool:
        return self.model is not None

    def __repr__(self) -> str:
        src = (
            type(self.model).__name__
            if self.model is not None and self.source not in SELF_SOURCES
            else self.source
        )
        return f"Teacher({src!r}{', template' if self.template else ''})"


class TeacherRouter(L.Callback):
    """Score every Experience row with the teacher of its ``domain``.

    An ExperienceHook (docs/architecture.md "Contracts").

    Args:
        teachers: domain → teacher: a model directory / hub id, ``"self"`` / ``"self_frozen"`` (OPSD), or a
            ``Teacher`` (with a privileged ``template``); in Python also an in-memory model.
        fallback: teacher for domains not in ``teachers``: a domain name of ``teachers`` or a teacher spec;
            None = an unknown domain is an error naming it and the known ones.
        device: where loaded teachers live (``cpu`` keeps them off the accelerator); None = the student's device.
        offload: keep loaded teachers on CPU between uses, moving each to the student's device only to score.
        dtype: dtype of every teacher loaded from a path or copied as ``self_frozen`` that does not set its own
            (``Teacher.dtype``); ``bfloat16`` halves float32 teachers' memory. None = the student's dtype.
        micro_batch_size: rows per teacher forward; None = the student's ``micro_batch_size``.
        teacher_samples: teacher rollouts per prompt for ``sft_on_success`` (DistillModule asks for them).
        success_threshold: a teacher rollout survives when its reward is valid and >= this.

    Attaches ``teacher_logprobs`` (B, C) (log π_T of the student's tokens at the student's sampling
    temperature) and, when the module asks for ``topk_reverse_kl``, ``extras["teacher_topk_logprobs"|
    "teacher_topk_ids"]`` (B, C, k) and ``extras["teacher_tail_logprob"]`` (B, C). Metrics per iteration:
    ``distill/<domain>/reverse_kl`` (mean over the domain's completion tokens of the sampled estimate
    log π_rollout − log π_T, i.e. an unbiased per-token reverse KL) and ``distill/<domain>/rows``.
    """

    def __init__(
        self,
        teachers: dict[str, str | Teacher],
        fallback: str | Teacher | None = None,
        device: str | None = None,
        offload: bool = False,
        micro_batch_size: int | None = None,
        teacher_samples: int = 4,
        success_threshold: float = 1.0,
        dtype: str | None = None,
    ):
        if not isinstance(teachers, dict) or not teachers:
            raise ValueError("TeacherRouter.teachers must be a non-empty mapping domain -> teacher")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or null, got {micro_batch_size}")
        if teacher_samples < 1:
            raise ValueError(f"teacher_samples must be >= 1, got {teacher_samples}")
        self.teachers = {
            str(d): self._as_teacher(t, f"TeacherRouter.teachers.{d}") for d, t in teachers.items()
        }
        if isinstance(fallback, str) and fallback in self.teachers:
            self.fallback: Teacher | None = self.teachers[fallback]
        else:
            self.fallback = None if fallback is None else self._as_teacher(fallback, "TeacherRouter.fallback")
        check_dtype(dtype, "TeacherRouter.dtype")
        for t in list(self.teachers.values()) + ([self.fallback] if self.fallback else []):
            if t.model is None and t.source != "self" and t.dtype is None:
                t.dtype = dtype  # "self" is the student's live weights: no copy to cast
        self.device, self.offload, self.micro_batch_size = device, offload, micro_batch_size
        self.teacher_samples, self.success_threshold = teacher_samples, success_threshold
        self.rows_total: dict[str, int] = {}  # domain -> rows scored over the run
        self._kl: dict[str, list[float]] = {}  # domain -> [sum, count, rows] of the current iteration
        self._score_s = 0.0  # wall seconds spent scoring this iteration's rows (perf/teacher_s)

    @staticmethod
    def _as_teacher(t, field: str) -> Teacher:
        if isinstance(t, Teacher):
            return t
        if isinstance(t, str):
            if t not in SELF_SOURCES:  # the error names the domain: teachers.<domain>='path'
                from lit_rl.models.loading import check_model_source

                check_model_source(t, field)
            return Teacher(source=t)
        if isinstance(t, torch.nn.Module):
            return Teacher(model=t.eval().requires_grad_(False))
        raise TypeError(
            f"{field}: expected a model path, 'self', 'self_frozen', a Teacher or a "
            f"torch.nn.Module, got {type(t).__name__}"
        )

    @property
    def domains(self) -> list[str]:
        return sorted(self.teachers)

    def route(self, domain: str) -> tuple[str, Teacher]:
        if domain in self.teachers:
            return domain, self.teachers[domain]
        if self.fallback is not None:
            return "fallback", self.fallback
        raise ValueError(
            f"TeacherRouter: no teacher for domain {domain!r}; known domains: {self.domains}. "
            "Add it to `teachers` or set `fallback`."
        )

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Explicit wiring: the RolloutCallback binds this router to the learner (its RolloutBinding);
        # DistillModule scores and samples through it.
        if stage == "fit":
            module = learner(pl_module, "TeacherRouter")
            for t in list(self.teachers.values()) + ([self.fallback] if self.fallback else []):
                t.snapshot(module)  # self_frozen: the initial student, before any checkpoint restore/update

    def check_teachers(self, module, full_vocab_loss: str | None) -> None:
        """Refuse, before any rollout, a teacher that cannot be loaded or whose tokenizer the student's losses
        cannot use: each path-based teacher's config, weights and tokenizer are read now (the weights
        themselves still load on first use). ``full_vocab_loss``: a loss comparing full next-token
        distributions, which needs the student's exact vocabulary (None: only ``reverse_kl_sampled``, which
        re-tokenises). A same-vocabulary teacher is scored token for token, so its eos / bos must be the
        student's too."""
        named = [(f"teachers.{d}", t) for d, t in self.teachers.items()]
        if self.fallback is not None and self.fallback not in self.teachers.values():
            named.append(("fallback", self.fallback))
        for field, teacher in named:
            if teacher.is_self:
                continue
            who = f"TeacherRouter.{field} ({teacher.source if teacher.model is None else repr(teacher)})"
            if teacher.model is None and teacher.tokenizer is None:
                teacher.tokenizer = readable_teacher(teacher.source, who)
            refuse_tokenizer(who, teacher.tokenizer or module.tokenizer, module.tokenizer, full_vocab_loss)

    # ---------------------------------------------------------------- placement
    def _acquire(self, module, teacher: Teacher):
        model, tok = teacher.get(module)
        if teacher.is_self:
            return model, tok
        target = torch.device(self.device) if self.device and not self.offload else module.device
        if next(model.parameters()).device != target:
            model.to(target)
        return model, tok

    def _release(self, teacher: Teacher) -> None:
        if self.offload and not teacher.is_self and teacher.model is not None:
            teacher.model.to("cpu")

    def _groups(self, exp: Experience) -> dict[str, tuple[Teacher, list[int]]]:
        domains = exp.domains or ["default"] * exp.batch_size
        out: dict[str, tuple[Teacher, list[int]]] = {}
        for i, d in enumerate(domains):
            key, t = self.route(d)
            out.setdefault(key, (t, []))[1].append(i)
        return out

    def check_full_vocab(self, module, teacher: Teacher, tok, loss: str) -> None:
        if not same_tokenizer(tok, module.tokenizer):
            raise ValueError(
                f"loss {loss!r} compares full next-token distributions, so teacher {teacher!r} must share the "
                f"student's tokenizer, but their vocabularies differ ({len(tok)} vs {len(module.tokenizer)} tokens). "
                "Use losses: {reverse_kl_sampled: 1.0} instead: it only needs the teacher's log-probs of the "
                "student's sampled text, which is re-tokenised for the teacher."
            )

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def teacher_heads(
        self, module, micro: Experience, loss: str = "reverse_kl_full"
    ) -> list[tuple[list[int], Any]]:
        """Per teacher group: ``(row indices into micro, source)``, the source being the teacher's
        ``core.fused_logprobs.Projection`` (hidden states (b', C, H_T) at the student's completion positions + its
        LM head) so full-vocabulary losses compute the teacher's logits chunk by chunk too, or its (b', C, V)
        logits when the teacher's model needs the materialised path (``learners.heads.projection_blocker``)."""
        out = []
        for teacher, idx in self._groups(micro).values():
            model, tok = self._acquire(module, teacher)
            self.check_full_vocab(module, teacher, tok, loss)
            view = teacher_view(teacher.template, micro.select(idx), tok)
            with _eval(model):
                fo = module.forward_outputs(view, model=model)
            self._release(teacher)
            src = fo["head"] if fo["head"] is not None else fo["logits"]
            V = src.vocab_size if fo["head"] is not None else src.shape[-1]
            if _student_vocab(module) != V:
                raise ValueError(
                    f"teacher {teacher!r} has {V} logits per position, the student "
                    f"{_student_vocab(module)}: full-vocabulary losses need identical vocabularies"
                )
            out.append((idx, src))
        return out

    @torch.no_grad()
    def teacher_logits(self, module, micro: Experience, loss: str = "reverse_kl_full") -> torch.Tensor | None:
        """Teacher logits over the student's completion positions, (b, C, V) on the micro-batch's device,
        each row from its own domain's teacher (full-vocabulary losses; the tokenizers must be identical)."""
        out = None
        for teacher, idx in self._groups(micro).values():
            model, tok = self._acquire(module, teacher)
            self.check_full_vocab(module, teacher, tok, loss)
            view = teacher_view(teacher.template, micro.select(idx), tok)
            with _eval(model):
                lg = module.forward_logits(view, model=model)  # (b', C, V)
            self._release(teacher)
            if out is None:
                out = lg.new_zeros((micro.batch_size, *lg.shape[1:])).to(micro.input_ids.device)
            if lg.shape[-1] != out.shape[-1]:
                raise ValueError(
                    f"teacher {teacher!r} has {lg.shape[-1]} logits per position, the student "
                    f"{out.shape[-1]}: full-vocabulary losses need identical vocabularies"
                )
            out[torch.as_tensor(idx, device=out.device)] = lg.to(out)
        return out

    @torch.no_grad()
    def on_experience(self, trainer: pl.Trainer, module: PolicyModule, exp: Experience) -> None:
        t0 = time.perf_counter()
        k = module.teacher_topk_k if isinstance(module, DistillModule) else None
        B, C = exp.batch_size, exp.completion_len
        dev = exp.input_ids.device
        dt = torch.float64 if module._float64_policy() else torch.float32  # a float64 run's exact checks
        tlp = torch.zeros((B, C), dtype=dt, device=dev)
        if k:
            tk_lp = torch.zeros((B, C, k), dtype=torch.float32, device=dev)
            tk_id = torch.zeros((B, C, k), dtype=torch.long, device=dev)
            tail = torch.zeros((B, C), dtype=torch.float32, device=dev)
        size = self.micro_batch_size or module.config.step.micro_batch_size
        for teacher, idx in self._groups(exp).values():
            model, tok = self._acquire(module, teacher)
            same, tpl = same_tokenizer(tok, module.tokenizer), teacher.template
            if k:
                self.check_full_vocab(module, teacher, tok, "topk_reverse_kl")
            rows = exp.select(idx)
            chunks = []
            for start in range(0, len(idx), size or len(idx)):
                part = idx[start : start + (size or len(idx))]
                micro = rows.select(list(range(start, start + len(part))))
                with _eval(model):
                    # log-probs + top-k, chunk by chunk through the teacher's LM head when it allows
                    if same and k:
                        fo = module.forward_outputs(teacher_view(tpl, micro, tok), model=model)
                        lg = fo["head"] if fo["head"] is not None else fo["logits"]  # Projection | (b, C, V)
                        if fo["head"] is not None:
                            ids = micro.completion_ids.to(lg.hidden.device)
                            lp = linear_logprobs(
                                lg.hidden,
                                lg.weight,
                                ids,
                                lg.bias,
                                module.temperature,
                                module.config.forward.logprob_chunk_size,
                                entropy=False,
                            )[0]
                        else:
                            lp = token_logprobs(
                                lg,
                                micro.completion_ids.to(lg.device),
                                module.config.forward.logprob_chunk_size,
                                module.temperature,
                            )  # (b, C)
                    elif same:  # chunked through the teacher's LM head
                        lp = module.completion_logprobs(teacher_view(tpl, micro, tok), model=model)
                    else:
                        lp = self._cross_logprobs(module, teacher, micro, model, tok)
                if k:
                    v, i_, t_ = teacher_topk(lg, k, module.temperature)
                    ii = torch.as_tensor(part, device=dev)
                    tk_lp[ii], tk_id[ii], tail[ii] = v.float().to(dev), i_.to(dev), t_.float().to(dev)
                chunks.append(lp.to(dt).to(dev))
            self._release(teacher)
            tlp[torch.as_tensor(idx, device=dev)] = torch.cat(chunks)
        exp.teacher_logprobs = tlp.masked_fill(~exp.loss_mask, 0.0)
        if k:
            exp.extras.update(teacher_topk_logprobs=tk_lp, teacher_topk_ids=tk_id, teacher_tail_logprob=tail)
        self._accumulate(exp)
        self._score_s += time.perf_counter() - t0

    def _cross_logprobs(self, module, teacher, micro, model, tok) -> torch.Tensor:
        view, owner = cross_tokenizer_view(teacher.template, micro, module.tokenizer, tok)
        view = view.to(next(model.parameters()).device)
        lp = module.completion_logprobs(view, model=model)  # (b, Ct), chunked through the teacher's LM head
        out = torch.zeros((micro.batch_size, micro.completion_len), dtype=torch.float32)
        own = owner.clamp(min=0)
        out.scatter_add_(1, own, lp.float().cpu().masked_fill(owner < 0, 0.0))  # sum teacher tokens per owner
        return out

    def _accumulate(self, exp: Experience) -> None:
        # a metric: the full softmax's log-probs when computed, else the old / engine ones (with processed sampling
        # those are the sampler's, a slight overstatement of the gap; no extra forward for a metric)
        pol = next(
            (x for x in (exp.old_full_logprobs, exp.old_logprobs, exp.rollout_logprobs) if x is not None),
            None,
        )
        domains = exp.domains or ["default"] * exp.batch_size
        teacher = exp.teacher_logprobs
        for i, d in enumerate(domains):
            acc = self._kl.setdefault(d, [0.0, 0, 0])
            m = exp.loss_mask[i]
            if pol is not None and teacher is not None and m.any():
                acc[0] += float((pol[i][m].double() - teacher[i][m].double()).sum())
                acc[1] += int(m.sum())
            acc[2] += 1
            self.rows_total[d] = self.rows_total.get(d, 0) + 1

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        for d, (s, n, rows) in self._kl.items():
            if n:
                pl_module.log(
                    f"distill/{d}/reverse_kl", s / n, on_step=True, on_epoch=False, batch_size=int(rows)
                )
            pl_module.log(f"distill/{d}/rows", float(rows), on_step=True, on_epoch=False, batch_size=1)
        if self._kl:  # loading a teacher on first use counts: it is time the iteration spends on teachers
            pl_module.log("perf/teacher_s", self._score_s, on_step=True, on_epoch=False, batch_size=1)
        self._kl, self._score_s = {}, 0.0

    # -------------------------------------------------------- teacher rollouts
    @torch.no_grad()
    def teacher_rollouts(
        self, module, prompts: list[Prompt], sampling, rewards
    ) -> tuple[Experience | None, dict]:
        """Rejection sampling: ``teacher_samples`` rollouts per prompt from its domain's teacher (from the
        privileged prompt when the teacher has a template), scored by ``rewards`` (a RewardPool); returns the
        survivors (valid reward >= ``success_threshold``) as an Experience in the *student's* tokens over the
        original prompts (teacher text re-tokenised, so the tokenizers may differ), plus metrics."""
        from lit_rl.rollout.engine import HFEngine

        n, stok = self.teacher_samples, module.tokenizer
        recs, texts, stops, comp_ids = [], [], [], []
        by_teacher: dict[str, tuple[Teacher, list[Prompt]]] = {}
        for p in prompts:
            key, t = self.route(p.domain)
            by_teacher.setdefault(key, (t, []))[1].append(p)
        for teacher, ps in by_teacher.values():
            model, tok = self._acquire(module, teacher)
            eng = HFEngine()
            eng.bind(SimpleNamespace(model=model, tokenizer=tok))
            prompt_ids = [
                render_prompt(privileged_prompt(teacher.template, p) if teacher.template else p, tok)
                for p in ps
            ]
            for p, group in zip(ps, eng.generate(prompt_ids, n, sampling)):
                for c in group:
                    recs.append(p)
                    texts.append(tok.decode(c.token_ids, skip_special_tokens=True))
                    comp_ids.append(
                        list(c.token_ids)
                    )  # the teacher's tokens (TRL-style rewards' completion_ids)
                    stops.append(c.finish_reason == "stop")
            self._release(teacher)
        rb = rewards.score(recs, texts, completion_ids=comp_ids)
        keep = [
            i for i in range(len(recs)) if bool(rb.valid[i]) and float(rb.total[i]) >= self.success_threshold
        ]
        metrics = {
            "distill/teacher_success_rate": len(keep) / max(len(recs), 1),
            "distill/sft_rows": float(len(keep)),
        }
        if not keep:
            return None, metrics
        p_ids = [render_prompt(recs[i], stok) for i in keep]
        c_ids = [
            stok(texts[i], add_special_tokens=False)["input_ids"] + ([stok.eos_token_id] if stops[i] else [])
            for i in keep
        ]
        return _pack(
            stok,
            p_ids,
            c_ids,
            [recs[i] for i in keep],
            rb.total[keep].float(),
            horizon=sampling.max_new_tokens,
        ), metrics

    def state_dict(self) -> dict[str, Any]:
        return {"rows_total": dict(self.rows_total)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows_total = dict(state.get("rows_total", {}))


def _pack(
    tok,
    p_ids: list[list[int]],
    c_ids: list[list[int]],
    recs: list[Prompt],
    rewards,
    horizon: int | None = None,
) -> Experience:
    """Left-padded prompts | right-padded completions as an Experience (loss mask = completion tokens; each row
    its own group; no rollout log-probs: the rows were not sampled by the policy), through the one
    ``ExperienceBuilder``; ``horizon`` is the run's (the student's token budget)."""
    rows = Rows(prompt_ids=p_ids, completion_ids=c_ids, prompts=recs, rewards=rewards)
    return ExperienceBuilder(horizon=horizon).pack(rows, tok.pad_token_id, group_ids=torch.arange(len(p_ids)))


class _eval:
    """Run a (possibly training-mode) model in eval mode for a teacher forward, then restore its mode."""

    def __init__(self, model):
        self.model, self.was = model, model.training

    def __enter__(self):
        self.model.eval()
        return self.model

    def __exit__(self, *exc):
        self.model.train(self.was)
        return False


def _student_vocab(module) -> int:
    return module.model.get_output_embeddings().weight.shape[0]
