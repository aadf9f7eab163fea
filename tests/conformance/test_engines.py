"""One conformance suite for every rollout engine (the contract: ``lit_rl/rollout/base.py``).

Adding an engine = one module + one line in ``ENGINES``. Every engine, constructed only (fast: nothing starts),
must be an ``EngineBase`` with every abstract method implemented, take the rollout's settings
(``RolloutSettings``: ``group_size``, ``sampling.max_new_tokens``) in ``bind``, and refuse the removed
arguments naming their replacement. Bound to the same tiny model (hidden 64, 2 heads: head dim 32, which
vLLM's CPU attention supports), each engine must:

- return completions whose log-probs are the trainer's recomputation, ``log softmax(logits / T)`` of a float64
  teacher-forced forward (default sampling: no processing);
- reproduce seeded samples after ``load_state_dict`` of an earlier ``state_dict``;
- generate from new weights right after ``update_weights(sync_items(model))``;
- refuse a prompt over ``limits()["max_model_len"]`` (engines that declare one);
- count calls, prompts, sequences and tokens in ``metrics()``, and keep them in ``state_dict``.
"""

from __future__ import annotations

import copy
import inspect
import types

import pytest
import torch

from lit_rl.models.loading import load_causal_lm, load_tokenizer
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.settings import RolloutSettings

PROMPTS = ["1+2=", "hello", "abc"]
_VLLM = [pytest.mark.vllm, pytest.mark.slow]  # vLLM start-up alone is ~30-60 s on 2 cores


def _fake():
    from _fake_engine import FakeEngine

    return FakeEngine(max_model_len=96)


def _hf():
    from lit_rl.rollout.engine import HFEngine

    return HFEngine(share_weights=False)  # own weights: update_weights must reach them


def _vllm():
    from lit_rl.rollout.vllm import VLLMEngine

    return VLLMEngine(
        max_model_len=96, kv_cache_memory_bytes=32 << 20, sync_timeout_s=60, llm_kwargs={"block_size": 32}
    )


def _server():
    from lit_rl.rollout.server import VLLMServerEngine

    return VLLMServerEngine(
        launch={"num_servers": 1, "max_model_len": 96, "max_num_seqs": 8, "timeout_s": 600},
        request_timeout_s=60,
        sync_timeout_s=120,
    )


ENGINES = [
    pytest.param(_fake, id="fake"),
    pytest.param(_hf, id="hf"),
    pytest.param(_vllm, id="vllm", marks=_VLLM),
    pytest.param(_server, id="server", marks=_VLLM),
]
# The same engines for the contract checks, which only construct them: not slow (vllm still needs vllm installed)
CONTRACT = [
    pytest.param(p.values[0], id=p.id, marks=[m for m in p.marks if m.name == "vllm"]) for p in ENGINES
]


@pytest.mark.parametrize("make", CONTRACT)
def test_engine_implements_the_one_contract(make):
    engine = make()
    cls = type(engine)
    assert isinstance(engine, EngineBase)
    assert EngineBase.__abstractmethods__ == {"bind", "generate", "update_weights"}
    assert not inspect.isabstract(cls)
    for name in EngineBase.__abstractmethods__:  # overridden, not the abstract placeholder
        assert getattr(cls, name) is not getattr(EngineBase, name), name
    # RolloutCallback.setup passes its RolloutSettings whole: every engine's bind accepts it
    inspect.signature(cls.bind).bind(engine, object(), RolloutSettings(group_size=4))
    assert isinstance(engine.state_dict(), dict)  # evaluation saves and restores it unconditionally
    assert engine.policy_version == 0


@pytest.mark.parametrize("make", CONTRACT)
@pytest.mark.parametrize(
    "name, value, fix",
    [
        pytest.param(
            "allow_truncated_logprobs",
            True,
            r"allow_truncated_logprobs was removed: .* delete the setting",
            id="allow_truncated_logprobs",
        ),
        pytest.param(
            "overlong_prompts",
            "drop",
            r"overlong_prompts was removed .* set RolloutCallback overlong_prompts",
            id="overlong_prompts",
        ),
    ],
)
def test_removed_arguments_name_their_replacement(make, name, value, fix):
    cls = type(make())
    with pytest.raises(TypeError, match=f"^{cls.__name__}: {fix}"):
        cls(**{name: value})


def test_an_object_that_is_not_an_engine_base_is_refused_in_one_line():
    from lit_rl.callbacks import RolloutCallback

    class DuckEngine:  # every member of the contract, but not the base class
        policy_version = 0

        def bind(self, module, rollout=None): ...

        def generate(self, prompt_ids, n, sampling): ...

        def update_weights(self, named_tensors): ...

    with pytest.raises(
        TypeError,
        match=r"^engine=DuckEngine is not a rollout engine: subclass "
        r"lit_rl\.rollout\.base\.EngineBase",
    ):
        RolloutCallback(engine=DuckEngine(), rewards=lambda prompt, completion: 0.0)

    class NoGenerate(EngineBase):
        def bind(self, module, rollout=None): ...

        def update_weights(self, named_tensors): ...

    with pytest.raises(TypeError, match="abstract.*generate"):
        NoGenerate()


def test_rollout_callback_binds_with_its_rollout_settings():
    from _fake_engine import FakeEngine

    from lit_rl.callbacks import RolloutCallback

    class Recording(FakeEngine):
        def bind(self, module, rollout=None):
            self.shape = (rollout.group_size, rollout.sampling.max_new_tokens)

    engine = Recording()
    rc = RolloutCallback(
        engine=engine,
        rewards=lambda prompt, completion: 0.0,
        group_size=3,
        sampling=SamplingConfig(max_new_tokens=7),
    )
    from lit_rl.learners.binding import RolloutBound

    class Learner(RolloutBound):  # the learner's side of the binding, without a model
        hparams = types.SimpleNamespace()

    module = Learner()
    rc.setup(types.SimpleNamespace(datamodule=None, callbacks=[]), module, "fit")
    assert module.rollout.engine is engine
    assert engine.shape == (3, 7)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from lit_rl.models.tiny import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("engines") / "m", layers=2, hidden=64, heads=2, tokenizer="char", seed=0
    )


@pytest.fixture(scope="module", params=ENGINES)
def bound(request, model_dir):
    module = types.SimpleNamespace(
        model=load_causal_lm(str(model_dir)),
        tokenizer=load_tokenizer(str(model_dir)),
        model_path=str(model_dir),
    )
    engine = request.param()
    engine.bind(
        module, RolloutSettings(group_size=3, sampling=SamplingConfig(max_new_tokens=5))
    )  # the largest n, max_new_tokens below
    yield engine, module
    engine.close()


def _ids(module):
    return [module.tokenizer.encode(p) for p in PROMPTS]


@torch.no_grad()
def _trainer_logprobs(model, prompt, completion, temperature):
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def _worst(model, prompts, groups, temperature):
    return max(
        float(
            (
                torch.tensor(c.logprobs, dtype=torch.float64)
                - _trainer_logprobs(model, p, c.token_ids, temperature)
            )
            .abs()
            .max()
        )
        for p, g in zip(prompts, groups)
        for c in g
    )


def test_logprobs_are_the_trainers_recomputation(bound):
    engine, module = bound
    engine.update_weights(engine.sync_items(module.model))
    for sp in (
        SamplingConfig(temperature=0.8, max_new_tokens=5),
        SamplingConfig(temperature=0.0, max_new_tokens=5),
    ):
        groups = engine.generate(_ids(module), 2, sp)
        assert [len(g) for g in groups] == [2] * len(PROMPTS)
        assert all(
            len(c.token_ids) == len(c.logprobs) > 0 and c.finish_reason in ("stop", "length")
            for g in groups
            for c in g
        )
        assert _worst(module.model, _ids(module), groups, sp.logprob_temperature) < 1e-4


def test_seeded_samples_replay_after_load_state_dict(bound):
    engine, module = bound
    sp = SamplingConfig(temperature=1.0, max_new_tokens=4, seed=7)
    state = copy.deepcopy(engine.state_dict())
    a = [[c.token_ids for c in g] for g in engine.generate(_ids(module), 2, sp)]
    b = [[c.token_ids for c in g] for g in engine.generate(_ids(module), 2, sp)]
    assert a != b  # the engine moved on: a second call draws new samples
    engine.load_state_dict(state)
    assert [[c.token_ids for c in g] for g in engine.generate(_ids(module), 2, sp)] == a


def test_update_weights_then_generate_sees_the_new_weights(bound):
    engine, module = bound
    new = copy.deepcopy(module.model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    version = engine.policy_version
    engine.update_weights(engine.sync_items(new))
    assert engine.policy_version == version + 1
    try:
        groups = engine.generate(_ids(module), 2, SamplingConfig(temperature=1.0, max_new_tokens=5))
        assert _worst(new, _ids(module), groups, 1.0) < 1e-4
        assert _worst(module.model, _ids(module), groups, 1.0) > 1e-2  # not the old weights
    finally:
        engine.update_weights(engine.sync_items(module.model))


def test_limits_are_enforced(bound):
    engine, module = bound
    limit = engine.limits()["max_model_len"]
    if limit is None:
        pytest.skip(f"{type(engine).__name__} declares no context limit")
    sp = SamplingConfig(temperature=0.0, max_new_tokens=4)
    fits = [module.tokenizer.encode("7") * (limit - 4)]  # one token per character
    assert engine.generate(fits, 1, sp)[0][0].token_ids
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([fits[0] + fits[0][:1]], 1, sp)


def test_counters_are_in_metrics_and_state(bound):
    engine, module = bound
    before = engine.metrics()
    groups = engine.generate(_ids(module), 3, SamplingConfig(temperature=1.0, max_new_tokens=4))
    after = engine.metrics()
    assert after["rollout/engine_calls"] == before["rollout/engine_calls"] + 1
    assert after["rollout/engine_prompts"] == before["rollout/engine_prompts"] + len(PROMPTS)
    assert after["rollout/engine_sequences"] == before["rollout/engine_sequences"] + 3 * len(PROMPTS)
    assert after["rollout/engine_tokens"] == before["rollout/engine_tokens"] + sum(
        len(c.token_ids) for g in groups for c in g
    )
    state = copy.deepcopy(engine.state_dict())
    engine.generate(_ids(module)[:1], 1, SamplingConfig(temperature=0.0, max_new_tokens=2))
    engine.load_state_dict(state)
    assert engine.metrics()["rollout/engine_sequences"] == after["rollout/engine_sequences"]
