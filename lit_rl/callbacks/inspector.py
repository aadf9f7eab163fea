"""`RolloutInspector`: the samples behind the metrics, written where a user can read them.

Every ``every_n_steps`` RL iterations the step's rows (prompt as the model received it -- the rendered chat
template, special tokens included --, completion, reward and its components,
advantage, finish reason, length, policy version / staleness, mean sampling log-prob, reward error; for an agent
episode also ``turns``: each turn's action, tool calls, observation, reward and advantage, ``_agent_turns.py``) go to

    <run dir>/rollouts/step_XXXXXX.jsonl      one JSON object per row (XXXXXX = the iteration, 1-based)

and to the active Lightning loggers through their own table APIs (TensorBoard ``add_text`` as a Markdown
table, W&B ``log_table``, MLflow ``log_table``; any other logger gets a one-line note, once). Every iteration
it also appends the step's scalar metrics and any new held-out points to ``rollouts/metrics.jsonl`` (the
report's curves). At the end of training it writes ``<run dir>/report.html`` (``lit_rl.report``).

Which rows (``max_rows_per_step`` bounds each file): whole prompt groups, in this order -- every group with a
reward error or a failed reward component (``extra["<reward>/error"]``; so failures are never sampled away),
then the best and the worst group by mean reward, then groups drawn at random (seeded by ``seed`` and the
step) until the budget is full; the last group may be cut.
Each row records why it was chosen (``pick``: error | best | worst | random | all).

Rank zero writes (each rank scores different prompts; the files show rank zero's share).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import lightning as L
import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_rl.callbacks._agent_turns import turn_records
from lit_rl.callbacks._learner import bound_rollout, rl_iteration
from lit_rl.core.seeds import run_seed
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, PromptBatch
from lit_rl.jsonl import clean, clean_text, dumps_line
from lit_rl.learners.policy import PolicyModule

# The step metrics the report plots; anything else in batch.metrics with these prefixes is kept too.
METRIC_PREFIXES = ("reward/", "rollout/", "eval/", "response_length/", "health/", "async/")
TABLE_COLUMNS = (
    "step",
    "group",
    "pick",
    "prompt",
    "completion",
    "reward",
    "advantage",
    "finish",
    "length",
    "staleness",
    "logprob",
    "error",
    "extra",
)


def prompt_text(prompt: Any) -> str:
    """The prompt record as written: raw text, or chat turns as ``role: content`` lines (used when no tokenizer
    is at hand; with one, ``row_records`` shows the tokens the model received instead)."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, Prompt):  # no record lit_rl knows: no text (as before the typed access)
        return ""
    if prompt.prompt is not None:
        return prompt.prompt
    msgs = prompt.messages or []
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in msgs)


def _f(x: float | None) -> float | None:
    """JSON-safe float: NaN / inf become null."""
    return None if x is None or not math.isfinite(x) else float(x)


def received_prompts(exp: Experience, tokenizer) -> list[str]:
    """The text each row's model input held before the completion: its prompt tokens (``input_ids[:, :P]`` where
    ``attention_mask`` is 1, so left padding is left out) decoded with special tokens kept, i.e. the rendered chat
    template (``<|im_start|>user ...<|im_start|>assistant``) and any truncation the length policy applied.
    One decode per distinct prompt (a group shares it). Shapes: ``input_ids``, ``attention_mask`` (B, P+C)."""
    P = exp.prompt_len
    ids, att = exp.input_ids[:, :P].tolist(), exp.attention_mask[:, :P].bool().tolist()
    cache: dict[tuple[int, ...], str] = {}
    out = []
    for row, keep in zip(ids, att):
        key = tuple(t for t, k in zip(row, keep) if k)
        if key not in cache:
            cache[key] = tokenizer.decode(list(key), skip_special_tokens=False)
        out.append(cache[key])
    return out


def row_records(
    exp: Experience, learner_version: int | None = None, max_text_chars: int = 4000, tokenizer=None
) -> list[dict]:
    """One dict per row of ``exp`` (B rows). Shapes read: ``loss_mask`` (B, C) bool; ``advantages`` and
    ``rollout_logprobs`` (B, C) (either may be None); ``rewards``, ``valid``, ``group_ids``, ``policy_version``
    (B,). The advantage and log-prob are means over the row's generated tokens (``loss_mask``). ``prompt`` is
    what the model received (``received_prompts``) when ``tokenizer`` is given, else the record's text."""
    received = received_prompts(exp, tokenizer) if tokenizer is not None else None
    mask = exp.loss_mask.float()
    n_tok = mask.sum(-1)  # (B,)
    denom = n_tok.clamp(min=1)

    def row_mean(t: torch.Tensor | None) -> list[float | None]:
        if t is None:
            return [None] * exp.batch_size
        m = (t.float() * mask).sum(-1) / denom
        return [None if n == 0 else _f(float(v)) for v, n in zip(m.tolist(), n_tok.tolist())]

    adv, lp = row_mean(exp.advantages), row_mean(exp.rollout_logprobs)
    errors = exp.reward_errors or [None] * exp.batch_size
    out = []
    for i in range(exp.batch_size):
        p = exp.prompts[i] if exp.prompts else None
        version = int(exp.policy_version[i])
        record = p if isinstance(p, Prompt) else None  # exp.prompts holds lit_rl Prompts (or None)
        answer = record.answer if record is not None else None
        out.append(
            {
                "row": i,
                "group": int(exp.group_ids[i]),
                "uid": record.uid if record is not None else None,
                "prompt": (received[i] if received is not None else prompt_text(p) if p is not None else "")[
                    :max_text_chars
                ],
                "answer": None if answer is None else str(answer)[:max_text_chars],
                "completion": (exp.texts[i] if exp.texts else "")[:max_text_chars],
                "reward": _f(float(exp.rewards[i])) if bool(exp.valid[i]) else None,
                "components": {k: _f(float(v[i])) for k, v in exp.reward_components.items()},
                "advantage": adv[i],
                "finish": exp.finish_reasons[i] if exp.finish_reasons else None,
                "length": int(n_tok[i]),
                "policy_version": version,
                "staleness": None if learner_version is None else learner_version - version,
                "logprob": lp[i],
                "error": errors[i],
                **({"extra": exp.reward_extras[i]} if exp.reward_extras and exp.reward_extras[i] else {}),
                # an episode row (agent loop): each turn's action, tool calls, observation, reward, advantage
                **(
                    {"turns": turn_records(exp, i, tokenizer, max_text_chars)}
                    if "obs_mask" in exp.extras
                    else {}
                ),
            }
        )
    return out


def select_groups(rows: list[dict], max_rows: int | None, rng: random.Random) -> list[dict]:
    """Rows of whole groups: error groups, best, worst, then random groups, cut at ``max_rows`` (module doc).
    Adds ``pick`` to every returned row; keeps the original row order inside a group."""
    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    if max_rows is None or len(rows) <= max_rows:
        return [{**r, "pick": "all"} for r in rows]

    def mean_reward(g: int) -> float:
        vals = [r["reward"] for r in groups[g] if r["reward"] is not None]
        return sum(vals) / len(vals) if vals else -math.inf

    order: list[tuple[int, str]] = [(g, "error") for g in groups if any(_failed(r) for r in groups[g])]
    rest = sorted((g for g in groups if not any(_failed(r) for r in groups[g])), key=mean_reward)
    if rest:
        order.append((rest.pop(), "best"))
    if rest:
        order.append((rest.pop(0), "worst"))
    rng.shuffle(rest)
    order += [(g, "random") for g in rest]
    out: list[dict] = []
    for g, why in order:
        for r in groups[g][: max_rows - len(out)]:
            out.append({**r, "pick": why})
        if len(out) >= max_rows:
            break
    return out


def _failed(row: dict) -> bool:
    """The row has no reward because of an error, or one of its reward components failed (``extra``)."""
    return bool(row["error"]) or any(k.endswith("/error") for k in row.get("extra") or {})


def _markdown(rows: list[dict], width: int = 200) -> str:
    def cell(v: Any) -> str:
        s = "" if v is None else (f"{v:.4g}" if isinstance(v, float) else clean_text(str(v)))
        s = " ".join(s.split())
        return (s[: width - 3] + "..." if len(s) > width else s).replace("|", "\\|")

    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in TABLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


class RolloutInspector(L.Callback):
    """Write each inspected step's rollouts to JSONL files, the loggers' tables and, at the end, an HTML report.

    Args:
        every_n_steps: inspect every this many RL iterations (1 = all).
        max_rows_per_step: rows kept per inspected step (whole groups, chosen as the module doc says);
            None keeps every row.
        dirpath: where the files go; None = ``<trainer.default_root_dir>/rollouts``, resolved at setup.
        log_to_loggers: also send the rows to the active loggers' table APIs.
        report: write ``<dirpath>/../report.html`` at the end of training (``lit-rl inspect`` rebuilds it).
        max_text_chars: prompts / completions / answers are cut to this many characters in the files.
        seed: seeds the random choice of groups (with the step number); None = the run's ``seed_everything``.
    """

    def __init__(
        self,
        every_n_steps: int = 1,
        max_rows_per_step: int | None = 64,
        dirpath: str | None = None,
        log_to_loggers: bool = True,
        report: bool = True,
        max_text_chars: int = 4000,
        seed: int | None = None,
    ):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if max_rows_per_step is not None and max_rows_per_step < 1:
            raise ValueError(f"max_rows_per_step must be >= 1 or None (every row), got {max_rows_per_step}")
        if max_text_chars < 1:
            raise ValueError(f"max_text_chars must be >= 1, got {max_text_chars}")
        self.every_n_steps, self.max_rows_per_step, self.dirpath = every_n_steps, max_rows_per_step, dirpath
        self.log_to_loggers, self.report, self.max_text_chars, self.seed = (
            log_to_loggers,
            report,
            max_text_chars,
            run_seed(seed),
        )
        self.dir: Path | None = None
        self._learner_version: int | None = None
        self._heldout_seen = 0
        self._noted: set[str] = set()

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.dir = Path(self.dirpath) if self.dirpath else Path(trainer.default_root_dir) / "rollouts"
        if trainer.is_global_zero:
            self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def out_dir(self) -> Path:
        """Where the rollout files go (set at ``setup``)."""
        if self.dir is None:
            raise RuntimeError("RolloutInspector.setup has not run: no output directory yet")
        return self.dir

    @property
    def report_path(self) -> Path:
        return self.out_dir.parent / "report.html"

    # ------------------------------------------------------------- per step
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: PromptBatch, batch_idx: int
    ) -> None:
        # The learner's weights version while this batch trains (RolloutCallback pushes after the step).
        rc = bound_rollout(pl_module)
        self._learner_version = int(rc.engine.policy_version) if rc is not None else None

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        if not trainer.is_global_zero or self.dir is None:
            return
        step = rl_iteration(trainer, pl_module)
        metrics = {
            k: _f(float(v))
            for k, v in batch.metrics.items()
            if k.startswith(METRIC_PREFIXES) and isinstance(v, (int, float))
        }
        self._append_metrics({"step": step, **metrics})
        self._flush_heldout(pl_module)
        exp = batch.experience
        if exp is None or step % self.every_n_steps:
            return
        # async: the learner's version is the producer's push count (the engine's own version lags behind it)
        learner = metrics.get("async/policy_version")
        learner = int(learner) if learner is not None else self._learner_version
        rows = select_groups(
            row_records(exp, learner, self.max_text_chars, _tokenizer(pl_module)),
            self.max_rows_per_step,
            random.Random(f"{self.seed}:{step}"),
        )
        # clean: a lone surrogate (a log_extra value decoded with surrogateescape) is U+FFFD in the file and in
        # every logger's table alike (TensorBoard's text summary, like a UTF-8 file, cannot encode it)
        records = [clean({"step": step, **r}) for r in rows]
        write_rows(self.dir / f"step_{step:06d}.jsonl", records)
        if self.log_to_loggers:
            self._to_loggers(trainer, step, records)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or self.dir is None:
            return
        self._flush_heldout(pl_module)  # HeldoutEval's final point is added in its on_train_end
        self._write_report()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # A run stopped by an error (e.g. RewardFailureError) is the one whose samples matter most.
        if trainer.is_global_zero and self.dir is not None:
            try:
                self._write_report()
            except Exception as e:  # noqa: BLE001 - never hide the exception that stopped the run
                rank_zero_info(f"RolloutInspector: could not write the report after the error: {e}")

    def _write_report(self) -> None:
        if not self.report or not any(self.out_dir.glob("*.jsonl")):
            return
        from lit_rl.report import build_report, skipped_note

        out, skipped = build_report(self.out_dir, self.report_path)
        if skipped:
            rank_zero_warn(f"RolloutInspector: {skipped_note(skipped)} ({self.out_dir})")
        rank_zero_info(
            f"RolloutInspector: report written to {out} (rebuild with `lit-rl inspect {self.out_dir.parent}`)"
        )

    # --------------------------------------------------------------- outputs
    def _append_metrics(self, rec: dict) -> None:
        path = self.out_dir / "metrics.jsonl"
        with open(path, "ab") as f:
            # a process killed mid-line left no "\n": the record starts a line of its own, not the torn one's end
            torn = f.tell() > 0 and _last_byte(path) != b"\n"
            f.write((b"\n" if torn else b"") + dumps_line(rec).encode("utf-8"))

    def _flush_heldout(self, pl_module: pl.LightningModule) -> None:
        rc = bound_rollout(pl_module)  # its evaluator: the HeldoutEval callback, or the default one
        if rc is None:
            return
        ev = rc.evaluator
        for h in ev.history[self._heldout_seen :]:
            self._append_metrics({k: (int(v) if k == "step" else _f(v)) for k, v in h.items()})
        self._heldout_seen = len(ev.history)

    def _to_loggers(self, trainer, step: int, rows: list[dict]) -> None:
        for logger in trainer.loggers:
            kind = type(logger).__name__
            table = [[_cell(r.get(c)) for c in TABLE_COLUMNS] for r in rows]
            if kind == "TensorBoardLogger":
                logger.experiment.add_text("rollouts", _markdown(rows), global_step=step)
            elif kind == "WandbLogger":
                logger.log_table(key="rollouts", columns=list(TABLE_COLUMNS), data=table)
            elif kind == "MLFlowLogger":
                data = {c: [row[j] for row in table] for j, c in enumerate(TABLE_COLUMNS)}
                logger.experiment.log_table(
                    logger.run_id, data=data, artifact_file=f"rollouts/step_{step:06d}.json"
                )
            elif kind not in self._noted and not isinstance(logger, L.pytorch.loggers.CSVLogger):
                # a CSV log (the CLI's default) never holds tables: the rollout files are its counterpart
                self._noted.add(kind)
                rank_zero_info(
                    f"RolloutInspector: {kind} has no table API; the rollouts are in {self.dir} "
                    f"(and {self.report_path} at the end)"
                )

    def state_dict(self) -> dict[str, Any]:
        return {"heldout_seen": self._heldout_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._heldout_seen = int(state.get("heldout_seen", 0))


def write_rows(path: Path, rows: list[dict]) -> None:
    """One rollout file: a JSON line per row (``lit_rl.jsonl.dumps_line``: any text, one line for every reader;
    ``log_extra`` values are the user's, any type, written as their ``str`` when JSON has none). "w": a resumed
    run rewrites its step."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(dumps_line(r) for r in rows)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1)


def _cell(v: Any) -> Any:
    return v if v is None or isinstance(v, (int, float, str)) else clean_text(str(v))


def _tokenizer(pl_module: pl.LightningModule) -> Any:
    """A lit_rl learner's tokenizer (decodes the rows' token ids); None for another module."""
    return pl_module.tokenizer if isinstance(pl_module, PolicyModule) else None
