"""The recipe half of ``scripts/bench_time_to_accuracy.py``: what each side is told to run, read from it.

``recipe_knobs``: what TRL must be told to do the recipe's work (prompts, group, new tokens, sampling, AdamW
lr and weight decay, optimizer steps per generated batch), and the task both sides train and are scored on;
it refuses a recipe the bench cannot match (not AdamW, a reference model, not one pass over the rows in
equal minibatches). ``lit_config``: the recipe as ``lit-rl fit`` runs it in the bench (the bench's clock
first, HeldoutEval out). ``train_order``: the training prompts in lit_rl's order, for TRL. The script keeps
the workers, the controller, the report and the command line.
"""

from __future__ import annotations

import copy

from lit_rl.core.steps import optimizer_steps_per_iteration


# ------------------------------------------------------------------ the recipe, read at run time
def _get(cfg: dict, dotted: str, default=KeyError):
    """``cfg["a"]["b"]`` for ``"a.b"``; a missing key is a one-line error naming the recipe field."""
    node = cfg
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            if default is KeyError:
                raise SystemExit(f"recipe: no `{dotted}`; the bench reads it to tell TRL what to match")
            return default
        node = node[key]
    return node


def recipe_knobs(cfg: dict) -> dict:
    """What TRL must be told to do the recipe's work, and the task both sides train and are scored on."""
    from lit_rl.rollout import SamplingConfig

    opt = _get(cfg, "model.init_args.optimizer")
    if not str(opt.get("class_path", "")).endswith("AdamW"):
        raise SystemExit(
            f"recipe: model.init_args.optimizer is {opt.get('class_path')}; the bench needs AdamW"
        )
    refs = [
        c for c in _get(cfg, "trainer.callbacks", []) if str(c.get("class_path", "")).endswith("ReferenceKL")
    ]
    if refs:
        raise SystemExit(
            "recipe: a ReferenceKL callback (beta > 0); this bench compares at beta 0: remove it"
        )
    sampling = SamplingConfig(**_get(cfg, "rollout.sampling", {}))
    rows = int(_get(cfg, "data.init_args.batch_size")) * int(_get(cfg, "rollout.group_size"))
    epochs, minibatch = (
        int(_get(cfg, "model.init_args.ppo_epochs", 1)),
        _get(cfg, "model.init_args.minibatch_size", None),
    )
    steps = optimizer_steps_per_iteration(rows, epochs, minibatch)
    if epochs != 1 or not steps:
        raise SystemExit(
            f"recipe: ppo_epochs={epochs}, minibatch_size={minibatch} over {rows} rows; the bench matches "
            "one pass over the rows in equal minibatches (TRL's steps_per_generation)"
        )
    return {
        "prompts": int(_get(cfg, "data.init_args.batch_size")),
        "group": int(_get(cfg, "rollout.group_size")),
        "new_tokens": sampling.max_new_tokens,
        "sampling": {
            k: getattr(sampling, k) for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        },
        "lr": float(_get(opt, "init_args.lr")),
        "weight_decay": float(_get(opt, "init_args.weight_decay", 0.01)),  # torch's AdamW default
        "task": _get(cfg, "data.init_args.task"),
        "task_args": _get(cfg, "data.init_args.task_args", {}) or {},
        "model": _get(cfg, "model.init_args.model"),
        "max_steps": int(_get(cfg, "trainer.max_steps")),
        "steps_per_iteration": steps,  # optimizer steps per generated batch: TRL's steps_per_generation
    }


def lit_config(
    recipe: dict,
    *,
    model: str,
    root: str,
    seed: int,
    max_steps: int,
    lr: float | None,
    clock_spec: str,
    hf_engine: bool,
) -> dict:
    """The recipe as ``lit-rl fit`` runs it here: the bench's clock first, HeldoutEval out, nothing else."""
    cfg = copy.deepcopy(recipe)
    cfg["seed_everything"] = seed
    trainer = cfg["trainer"]
    trainer.update(default_root_dir=root, max_steps=max_steps)
    kept = [
        c for c in trainer.get("callbacks", []) if not str(c.get("class_path", "")).endswith("HeldoutEval")
    ]
    # First in the list: its final evaluation runs before SaveHFModel & co. at the end of training.
    clock = {"class_path": "bench_time_to_accuracy.LitClock", "init_args": {"spec": clock_spec}}
    trainer["callbacks"] = [clock] + kept
    cfg["model"]["init_args"]["model"] = model
    if lr is not None:
        cfg["model"]["init_args"]["optimizer"]["init_args"]["lr"] = lr
    if hf_engine:
        cfg["rollout"]["engine"] = {"class_path": "lit_rl.rollout.HFEngine"}
    return cfg


def train_order(n_train: int, seed: int, prompts: int, iterations: int) -> list[int]:
    """The training-prompt indices lit_rl's datamodule yields over ``iterations`` (one rank), in order."""
    from lit_rl.data.datamodule import _InfiniteShuffle

    stream = iter(_InfiniteShuffle(n_train, seed, prompts))
    return [next(stream) for _ in range(prompts * iterations)]
