"""RolloutInspector: row records, group choice, files and logger tables from a real run; the always-failing reward
stops a real run; `lit-rl inspect`; the HTML report checked in headless Chromium."""

from __future__ import annotations

import functools
import json
import math
import os
import random
import re
import threading
import warnings
from pathlib import Path
from urllib.parse import quote

import lightning as L
import pytest
import torch

from lit_rl.callbacks import HeldoutEval, RolloutCallback, RolloutInspector
from lit_rl.callbacks.inspector import row_records, select_groups
from lit_rl.data import PromptDataModule
from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule
from lit_rl.report import load_run
from lit_rl.report.chromium import dump_dom, find_chromium, screenshot
from lit_rl.rewards import RewardErrorWarning, RewardFailureError, RewardPool
from lit_rl.rollout import SamplingConfig

TASK = {"answer_width": 1, "max_sum": 9}
STEPS = 4


# ------------------------------------------------------------------ pure parts
def _exp():
    # 4 rows, 2 groups, 3 completion tokens; row 3 has no reward (error) and only 1 generated token
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([[0.5, 0.5, 9.0], [-0.5, -0.5, -0.5], [1.0, 7.0, 7.0], [0.0, 3.0, 3.0]])
    lp = torch.tensor([[-1.0, -2.0, -50.0], [-0.3, -0.3, -0.6], [-2.0, 0.0, 0.0], [-4.0, 0.0, 0.0]])
    from lit_rl.data.prompts import Prompt

    ps = [Prompt(prompt="1+1=", answer="2", uid="a")] * 2 + [
        Prompt(messages=[{"role": "user", "content": "hi"}])
    ] * 2
    return Experience(
        input_ids=torch.zeros(4, 5, dtype=torch.long),
        attention_mask=torch.ones(4, 5, dtype=torch.long),
        loss_mask=mask,
        prompt_len=2,
        group_ids=torch.tensor([7, 7, 8, 8]),
        rewards=torch.tensor([1.0, 0.0, 0.5, float("nan")]),
        valid=torch.tensor([True, True, True, False]),
        policy_version=torch.tensor([3, 3, 2, 2]),
        reward_components={"exact": torch.tensor([1.0, 0.0, 0.5, math.nan])},
        rollout_logprobs=lp,
        advantages=adv,
        finish_reasons=["stop", "length", "stop", "stop"],
        prompts=ps,
        texts=["2", "3xx", "yo", "?"],
        reward_errors=[None, None, None, "exact: ValueError: no"],
    )


def test_row_records_hand_computed():
    rows = row_records(_exp(), learner_version=3)
    assert [r["advantage"] for r in rows] == [0.5, -0.5, 1.0, 0.0]  # mean over loss_mask only
    assert rows[0]["logprob"] == pytest.approx(-1.5, abs=1e-7) and rows[1]["logprob"] == pytest.approx(
        -0.4, abs=1e-7
    )
    assert [r["length"] for r in rows] == [2, 3, 1, 1]
    assert [r["staleness"] for r in rows] == [0, 0, 1, 1]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 0.5, None]  # invalid: null, never NaN in JSON
    assert rows[3]["components"] == {"exact": None} and rows[3]["error"] == "exact: ValueError: no"
    assert rows[0]["prompt"] == "1+1=" and rows[0]["answer"] == "2" and rows[2]["prompt"] == "user: hi"
    assert [r["group"] for r in rows] == [7, 7, 8, 8] and rows[1]["finish"] == "length"
    json.dumps(rows, allow_nan=False)  # strict JSON


def test_prompt_is_the_text_the_model_received(tiny_model_dir):
    """Issue 26: the inspector showed chat prompts as "user: ..." lines; the model received the rendered chat
    template (ChatML here: the tiny tokenizer's), and a plain prompt as its own text, both left-padded."""
    from lit_rl.data.experience import pad_prompts_completions
    from lit_rl.data.prompts import Prompt, render_prompt
    from lit_rl.models.loading import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    chat = Prompt(
        messages=[{"role": "system", "content": "Add."}, {"role": "user", "content": "1+2="}], answer="3"
    )
    plain = Prompt(prompt="4+4=", answer="8")
    ids = [render_prompt(p, tok) for p in (chat, chat, plain, plain)]
    inp, att, loss, P = pad_prompts_completions(tok.pad_token_id, ids, [[5], [6, 7], [5], [8]])
    exp = Experience(
        input_ids=inp,
        attention_mask=att,
        loss_mask=loss,
        prompt_len=P,
        group_ids=torch.tensor([0, 0, 1, 1]),
        rewards=torch.zeros(4),
        valid=torch.ones(4, dtype=torch.bool),
        policy_version=torch.zeros(4),
        prompts=[chat, chat, plain, plain],
        texts=["a", "b", "c", "d"],
        finish_reasons=["stop"] * 4,
    )
    rows = row_records(exp, tokenizer=tok)
    assert (
        rows[0]["prompt"]
        == rows[1]["prompt"]
        == ("<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n")
    )
    assert rows[2]["prompt"] == rows[3]["prompt"] == "4+4="  # the padding of the shorter prompt is left out
    assert row_records(exp)[0]["prompt"] == "system: Add.\nuser: 1+2="  # no tokenizer: the record as written


def _rows(groups):
    """groups: {gid: (rewards, errors)} -> row dicts as row_records makes them."""
    out, i = [], 0
    for g, (rs, errs) in groups.items():
        for r, e in zip(rs, errs):
            out.append({"row": i, "group": g, "reward": r, "error": e})
            i += 1
    return out


def test_select_groups_errors_best_worst_then_random():
    rows = _rows(
        {
            0: ([0.5, 0.5], [None, None]),
            1: ([1.0, 1.0], [None, None]),
            2: ([0.0, 0.0], [None, None]),
            3: ([1.0, None], [None, "boom"]),
            4: ([0.2, 0.2], [None, None]),
            5: ([0.4, 0.4], [None, None]),
        }
    )
    got = select_groups(rows, 7, random.Random(0))
    picks = [(r["group"], r["pick"]) for r in got]
    assert picks[:6] == [(3, "error"), (3, "error"), (1, "best"), (1, "best"), (2, "worst"), (2, "worst")]
    assert (
        len(got) == 7 and picks[6][1] == "random" and picks[6][0] in (0, 4, 5)
    )  # a cut group: its first row
    assert got[6]["row"] == min(r["row"] for r in rows if r["group"] == picks[6][0])
    # same seed, same choice; everything fits: every row, in order
    assert select_groups(rows, 7, random.Random(0)) == got
    assert [r["row"] for r in select_groups(rows, None, random.Random(0))] == list(range(12))
    assert {r["pick"] for r in select_groups(rows, 12, random.Random(0))} == {"all"}


@pytest.mark.parametrize(
    "field,value", [("every_n_steps", 0), ("max_rows_per_step", 0), ("max_text_chars", 0)]
)
def test_inspector_validates_fields(field, value):
    with pytest.raises(ValueError, match=field):
        RolloutInspector(**{field: value})


# ------------------------------------------------------------------ a short real run
class Spy(L.Callback):
    """Records each step's reward errors straight from the Experience (what the files must reproduce)."""

    def __init__(self):
        self.errors: dict[int, list] = {}
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        self.errors[pl_module.iteration] = list(batch.experience.reward_errors)


def _every_7th_call_fails():
    calls, lock = [0], threading.Lock()

    def picky(prompt, completion):
        with lock:
            calls[0] += 1
            n = calls[0]
        if n % 7 == 3:
            raise LookupError(f"cannot judge call {n}")
        return float(completion.strip() == prompt.answer)

    return picky


def _fit(root, reward, callbacks, steps=STEPS, loggers=False, **pool_kw):
    mod = PolicyModule(model=str(root["model"]), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    pool = RewardPool({"picky": reward}, **pool_kw)
    rc = RolloutCallback(rewards=pool, group_size=4, sampling=SamplingConfig(max_new_tokens=2))
    trainer = L.Trainer(
        max_steps=steps,
        max_epochs=-1,
        accelerator="cpu",
        logger=loggers,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, *callbacks],
        default_root_dir=str(root["dir"]),
        log_every_n_steps=1,
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
    return trainer


@pytest.fixture(scope="module")
def short_run(tiny_model_dir, tmp_path_factory):
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    d = tmp_path_factory.mktemp("inspect_run")
    spy = Spy()
    spy.inspector = RolloutInspector(max_rows_per_step=8)
    loggers = [TensorBoardLogger(str(d), name="tb"), CSVLogger(str(d), name="csv")]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        _fit(
            {"model": tiny_model_dir, "dir": d},
            _every_7th_call_fails(),
            [HeldoutEval(every_n_steps=2, max_prompts=4), spy, spy.inspector],
            loggers=loggers,
            max_invalid_frac=None,
        )
    return d, spy, [w for w in rec if issubclass(w.category, RewardErrorWarning)]


def _file_rows(d):
    rows = {}
    for p in sorted((d / "rollouts").glob("step_*.jsonl")):
        rows[int(p.stem.split("_")[1])] = [json.loads(x) for x in p.read_text().splitlines()]
    return rows


def test_inspector_files_carry_every_row_and_its_reward_error(short_run):
    d, spy, warned = short_run
    rows = _file_rows(d)
    assert sorted(rows) == list(range(1, STEPS + 1)) and all(len(v) == 8 for v in rows.values())
    n_err = 0
    for step, rs in rows.items():
        assert [r["error"] for r in rs] == spy.errors[step]  # 8 rows fit the budget: all, in order
        for r in rs:
            assert (r["error"] is None) == (r["reward"] is not None)
            if r["error"]:
                n_err += 1
                assert re.fullmatch(r"picky: LookupError: cannot judge call \d+", r["error"])
            assert r["staleness"] == 0 and r["policy_version"] == step - 1  # sync: one weight push per step
            assert r["pick"] == "all" and r["length"] in (1, 2) and r["logprob"] <= 0
    assert n_err >= 1
    assert len(warned) >= n_err // 2 and "picky: LookupError" in str(warned[0].message)
    # metrics.jsonl: one train record per step, plus the held-out points (step 0 baseline, 2, 4)
    recs = [json.loads(x) for x in (d / "rollouts/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "reward/mean" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in recs if "eval/accuracy" in r] == [0, 2, 4]
    assert all("response_length/mean" in r for r in recs if "reward/mean" in r)


def test_inspector_tables_reach_tensorboard(short_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d, _, _ = short_run
    ev = EventAccumulator(str(next((d / "tb").glob("version_*"))), size_guidance={"tensors": 0}).Reload()
    tags = ev.Tags()["tensors"]
    assert "rollouts/text_summary" in tags
    events = ev.Tensors("rollouts/text_summary")
    assert [e.step for e in events] == list(range(1, STEPS + 1))
    md = events[0].tensor_proto.string_val[0].decode()
    assert md.splitlines()[0].startswith("| step | group | pick | prompt | completion | reward")
    assert len(md.splitlines()) == 2 + 8
    # the CSV logger never holds tables (the rollout files are its counterpart): not noted; TensorBoard neither
    assert short_run[1].inspector._noted == set()


def test_wandb_table_call_matches_lightnings_signature():
    """wandb is not installed here, so the W&B branch is checked against Lightning's own method signature."""
    import inspect

    from lightning.pytorch.loggers import WandbLogger

    params = inspect.signature(WandbLogger.log_table).parameters
    assert {"key", "columns", "data"} <= set(params)


def test_report_written_at_train_end_and_by_the_cli(short_run, tmp_path, monkeypatch, capsys):
    """`lit-rl inspect RUN -o r.html` through the console script's entry function (in-process: a fresh `lit-rl`
    process spends ~15 s importing Lightning for LightningCLI before it reaches the dispatch)."""
    from lit_rl.cli import console_main

    d, _, _ = short_run
    assert (d / "report.html").stat().st_size > 1000
    out = tmp_path / "r.html"
    monkeypatch.setattr("sys.argv", ["lit-rl", "inspect", str(d), "-o", str(out)])
    with pytest.raises(SystemExit) as e:
        console_main()
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}")
    html = out.read_text()
    assert "<script src" not in html and "http://" not in html and "https://" not in html  # self-contained
    data = load_run(d / "rollouts")
    assert data["steps"] == [1, 2, 3, 4] and sum(len(v) for v in data["rows"].values()) == 32


def test_inspect_without_rollouts_exits_2_with_the_fix(tmp_path, capsys):
    from lit_rl.report import main

    assert main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no rollouts found" in err and "callbacks/inspect.yaml" in err


def test_inspect_default_output_is_run_dir_report(short_run, tmp_path, capsys):
    import shutil

    from lit_rl.report import main

    d, _, _ = short_run
    run = tmp_path / "copy"
    shutil.copytree(d / "rollouts", run / "rollouts")
    assert main([str(run)]) == 0  # `lit-rl inspect runs/quickstart` -> runs/quickstart/report.html
    assert (run / "report.html").read_text().count('"steps":[1,2,3,4]') == 1
    assert capsys.readouterr().out.startswith(f"wrote {run / 'report.html'}")
    assert main([str(run / "rollouts")]) == 0  # the rollouts folder itself works too


def test_a_reward_that_always_fails_stops_a_real_run_at_the_first_step(tiny_model_dir, tmp_path):
    """Issue 26: it used to train `window` steps on nothing first (and a shorter run ended green)."""

    def always(prompt, completion):
        raise RuntimeError("judge is down")

    spy = Spy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RewardErrorWarning)
        with pytest.raises(RewardFailureError) as e:
            _fit(
                {"model": tiny_model_dir, "dir": tmp_path},
                always,
                [spy, RolloutInspector()],
                steps=20,
                window=3,
            )
    assert spy.steps == 0  # step 1's scoring stopped the run: nothing trained on rows without a reward
    assert "none of the 8 rows of this scoring call has a reward" in str(e.value)
    assert "Most frequent error (8x): picky: RuntimeError: judge is down" in str(e.value)


# ------------------------------------------------------------------ the report in a real browser
needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium not installed (Debian: "
    "apt-get install -y chromium; scripts/install.sh does it with the dev extra)",
)


def _dom_rows(dom):
    return [
        (int(s), int(r), e == "1", f)
        for s, r, e, f in re.findall(
            r'<tr class="row" data-step="(\d+)" data-row="(\d+)" data-err="(\d)" data-finish="([^"]*)"', dom
        )
    ]


@needs_chromium
def test_report_in_chromium_rows_filters_curves(short_run, tmp_path):
    d, _, _ = short_run
    url = (d / "report.html").as_uri()
    files = _file_rows(d)
    errors = {(s, r["row"]) for s, rs in files.items() for r in rs if r["error"]}
    # default view: the last step's rows, every filter control, the curves
    dom = dump_dom(url)
    assert {(s, r) for s, r, _, _ in _dom_rows(dom)} == {(STEPS, r["row"]) for r in files[STEPS]}
    for control in ("f-reward", "f-errors", "f-trunc", "f-q", "f-all", "slider", "steplist"):
        assert f'id="{control}"' in dom
    keys = set(re.findall(r'<polyline class="curve" data-key="([^"]+)"', dom))
    assert {"reward/mean", "eval/accuracy", "rollout/response_len_mean", "reward/invalid_frac"} <= keys
    assert float(re.search(r'data-load-ms="([0-9.]+)"', dom).group(1)) > 0
    # "errors only" over all steps shows exactly the rows that had reward errors
    shown = _dom_rows(dump_dom(url + "#all=1&errors=1&pagesize=1000"))
    assert (
        {(s, r) for s, r, _, _ in shown} == errors
        and all(e for _, _, e, _ in shown)
        and len(shown) == len(errors)
    )
    # "truncated only" and a text search
    trunc = {(s, r["row"]) for s, rs in files.items() for r in rs if r["finish"] == "length"}
    assert {(s, r) for s, r, _, _ in _dom_rows(dump_dom(url + "#all=1&trunc=1&pagesize=1000"))} == trunc
    hit = next(r for r in files[1] if r["error"] is None)
    q = hit["completion"] if hit["completion"].strip() else None
    if q:
        found = {
            (s, r) for s, r, _, _ in _dom_rows(dump_dom(url + "#all=1&pagesize=1000&q=" + quote(q, safe="")))
        }
        want = {
            (s, r["row"])
            for s, rs in files.items()
            for r in rs
            if q.lower()
            in "\n".join([r["prompt"], r["answer"] or "", r["completion"], r["error"] or ""]).lower()
        }
        assert found == want
    # reward = 1 rows only; the diff view of one prompt at two steps
    ones = {(s, r["row"]) for s, rs in files.items() for r in rs if r["reward"] == 1.0}
    assert {(s, r) for s, r, _, _ in _dom_rows(dump_dom(url + "#all=1&reward=1&pagesize=1000"))} == ones
    assert "Same prompt at two steps" in dump_dom(url + "#step=1&diff=0")
    shot_dir = Path(os.environ.get("LIT_RL_SCREENSHOT_DIR", tmp_path))
    png = screenshot(url + "#all=1&errors=1", shot_dir / "report_screenshot.png")  # the failing rows
    assert png.stat().st_size > 10_000


# ------------------------------------------------------------------ recipes
ROOT = Path(__file__).resolve().parents[2]


def test_every_recipe_has_the_inspector_on():
    import yaml

    for cfg in sorted((ROOT / "configs").glob("*.yaml")):
        cbs = yaml.safe_load(cfg.read_text())["trainer"]["callbacks"]
        assert any(c["class_path"] == "lit_rl.callbacks.RolloutInspector" for c in cbs), cfg.name


def test_fragment_on_a_config_of_your_own_writes_under_default_root_dir(
    tmp_path, monkeypatch, tiny_model_dir
):
    """README: `lit-rl fit -c my_config.yaml -c callbacks/inspect.yaml` (my_config: grpo.yaml minus its inspector)."""
    import yaml

    from lit_rl.cli import main

    cfg = yaml.safe_load((ROOT / "configs/grpo.yaml").read_text())
    cfg["trainer"]["callbacks"] = [
        c for c in cfg["trainer"]["callbacks"] if "RolloutInspector" not in c["class_path"]
    ]
    (tmp_path / "my_config.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    cli = main(
        [
            "fit",
            "-c",
            "my_config.yaml",
            "-c",
            str(ROOT / "callbacks/inspect.yaml"),
            "--trainer.max_steps",
            "2",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--model.init_args.model",
            str(tiny_model_dir),
            "--data.init_args.batch_size",
            "2",
            "--trainer.default_root_dir",
            "out",
        ]
    )
    insp = [cb for cb in cli.trainer.callbacks if isinstance(cb, RolloutInspector)]
    assert len(insp) == 1 and insp[0].dir == Path("out/rollouts")  # resolved from trainer.default_root_dir
    rows = [json.loads(x) for x in (tmp_path / "out/rollouts/step_000002.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 8 and {r["step"] for r in rows} == {2}  # 2 prompts x group_size 8 <= 64 rows
    assert (tmp_path / "out/report.html").exists()


def test_async_staleness_in_the_files_matches_the_async_metric(tiny_model_dir, tmp_path):
    """Async rows were generated by older weights: the files' staleness is learner pushes - row version, the same
    numbers RolloutCallback logs as async/staleness_mean (the engine's own version lags the learner's)."""
    from lit_rl.rewards import ExactAnswerReward

    mod = PolicyModule(
        model=str(tiny_model_dir),
        optimizer=functools.partial(torch.optim.AdamW, lr=1e-2),
        rollout_correction="tis",
    )
    rc = RolloutCallback(
        rewards={"exact": ExactAnswerReward()},
        group_size=4,
        mode="async",
        max_staleness=2,
        sampling=SamplingConfig(max_new_tokens=1),
    )
    trainer = L.Trainer(
        max_steps=5,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[rc, RolloutInspector(max_rows_per_step=None, report=False)],
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
    recs = {
        r["step"]: r for r in map(json.loads, (tmp_path / "rollouts/metrics.jsonl").read_text().splitlines())
    }
    seen = []
    for step, rows in _file_rows(tmp_path).items():
        stale = [r["staleness"] for r in rows]
        assert all(r["staleness"] == recs[step]["async/policy_version"] - r["policy_version"] for r in rows)
        assert sum(stale) / len(stale) == pytest.approx(recs[step]["async/staleness_mean"], abs=1e-12)
        seen += stale
    assert max(seen) >= 1  # the producer ran ahead at least once: a real off-policy row was checked
    assert not (tmp_path / "report.html").exists()  # report=False


def test_a_group_with_a_failed_component_is_an_error_pick_although_its_rows_have_rewards():
    rows = _rows(
        {0: ([1.0, 1.0], [None, None]), 1: ([0.0, 0.0], [None, None]), 2: ([0.5, 0.5], [None, None])}
    )
    rows[5]["extra"] = {"judge/error": "TimeoutError"}  # group 2: its reward came from the other components
    rows[0]["extra"] = {"golden_answer": "3"}  # a log_extra column is not a failure
    picks = [(r["group"], r["pick"]) for r in select_groups(rows, 4, random.Random(0))]
    assert picks == [(2, "error"), (2, "error"), (0, "best"), (0, "best")]
