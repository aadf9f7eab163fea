"""The closed sets of names a config chooses from, as ``typing.Literal`` types.

jsonargparse lists a ``Literal``'s values in ``--help`` and rejects anything else while parsing, naming the
field. Names that come from a registry (advantage estimators, policy losses, tasks) are typed
``Literal[built-ins] | str``: ``--help`` shows the built-in names, and a name registered by the user's own
code (``@ADVANTAGES.register("mine")`` in a module loaded with ``lit-rl fit --imports my_module``) is still
accepted; the registry checks it when the module is built. ``tests/test_cli_help.py`` keeps these lists
equal to the registries and tuples they mirror.
"""

from __future__ import annotations

from typing import Literal

AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce", "gae", "opd"]
PolicyLossName = Literal["ppo_clip", "gspo", "cispo", "sapo", "vespo", "reinforce"]
LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
CorrectionMode = Literal["none", "tis", "mis"]
StdScope = Literal["group", "batch"]
CorrectionLevel = Literal["token", "sequence", "geometric"]
OverlongPrompts = Literal["truncate", "drop", "error"]
RolloutMode = Literal["sync", "async"]
StalePolicy = Literal["drop", "regenerate"]
TaskName = Literal[
    "addition",
    "agent_guess",
    "agent_lookup",
    "agent_multiply",
    "chat_addition",
    "chat_compare",
    "chat_largest",
    "chat_mixed",
    "chat_multiply_digit",
    "reverse",
]
