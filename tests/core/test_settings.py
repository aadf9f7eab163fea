"""``core.settings``: one declaration per setting gives the signature, the docs, the split and the errors."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import pytest

from lit_rl.core.settings import check_choices, declared, flat_settings, flat_values, setting, split_settings


@dataclass(frozen=True, kw_only=True)
class _Obj:
    loss_agg: str = setting("token_mean", "How token losses average.", choices=("token_mean", "seq_mean"))
    clip_low: float = setting(0.2, "Lower ratio clip.")


@dataclass(frozen=True, kw_only=True)
class _Step:
    ppo_epochs: int = setting(1, "Passes over each Experience.")
    lora: dict | None = setting(None, "LoRA keyword arguments.")


@flat_settings((_Obj, _Step))
class _Mod:
    """A module.

    Args:
        model: the model path.
        critic: a critic.
    """

    def __init__(self, model: str, critic: int | None = None, **settings):
        self.obj, self.step = split_settings(
            "_Mod", (_Obj, _Step), settings, moved={"old_name": "write loss_agg"}
        )


def test_signature_lists_each_field_once_in_group_order_with_its_default():
    params = inspect.signature(_Mod).parameters
    assert list(params) == ["model", "loss_agg", "clip_low", "ppo_epochs", "lora", "critic"]
    assert params["loss_agg"].default == "token_mean" and params["loss_agg"].annotation is str
    assert params["ppo_epochs"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["critic"].kind is inspect.Parameter.KEYWORD_ONLY


def test_docstring_gets_each_field_doc_with_its_choices():
    doc = _Mod.__doc__
    assert "        loss_agg: How token losses average. One of: token_mean, seq_mean." in doc
    assert doc.count("ppo_epochs:") == 1


def test_split_fills_defaults_and_flat_values_round_trips():
    m = _Mod("x", clip_low=0.3, ppo_epochs=2)
    assert m.obj == _Obj(clip_low=0.3) and m.step == _Step(ppo_epochs=2)
    assert flat_values(m.obj, m.step) == {
        "loss_agg": "token_mean",
        "clip_low": 0.3,
        "ppo_epochs": 2,
        "lora": None,
    }


def test_unknown_and_moved_names_are_one_line_errors_naming_the_fix():
    with pytest.raises(TypeError, match=r"^_Mod: unknown setting 'los_agg'; did you mean 'loss_agg'\?$"):
        _Mod("x", los_agg="seq_mean")
    with pytest.raises(TypeError, match=r"^_Mod: setting 'old_name' was moved: write loss_agg$"):
        _Mod("x", old_name=1)
    with pytest.raises(TypeError, match=r"^_Mod: unknown setting 'zzz'$"):
        _Mod("x", zzz=1)


def test_choices_fixed_and_from_a_callable():
    check_choices(_Obj(loss_agg="seq_mean"))
    with pytest.raises(ValueError, match=r"^loss_agg='bad'; valid values: token_mean, seq_mean$"):
        check_choices(_Obj(loss_agg="bad"))
    names = ["a"]

    @dataclass(frozen=True, kw_only=True)
    class _Reg:
        name: str = setting("a", "A registered name.", choices=lambda: names)

    with pytest.raises(ValueError, match="valid values: a$"):
        check_choices(_Reg(name="b"))
    names.append("b")  # a user's registration after the declaration is accepted
    check_choices(_Reg(name="b"))


def test_a_name_declared_in_two_groups_is_refused():
    @dataclass(frozen=True, kw_only=True)
    class _Again:
        clip_low: float = setting(0.1, "Declared twice.")

    with pytest.raises(TypeError, match="'clip_low' is declared in both _Obj and _Again"):
        declared((_Obj, _Again))
