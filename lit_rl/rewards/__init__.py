from lit_rl.rewards.adapters import TRLRewardAdapter
from lit_rl.rewards.base import RewardFn, RewardResult, TrainerState
from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.pool import RewardBatch, RewardErrorWarning, RewardFailureError, RewardPool
from lit_rl.rewards.reward_model import RewardModelReward
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError
from lit_rl.rewards.verifiers import (
    ExactAnswerReward,
    LastIntReward,
    MathAnswerReward,
    PrefixMatchReward,
    RegexFormatReward,
)

__all__ = [
    "CodeTestsReward",
    "ExactAnswerReward",
    "LastIntReward",
    "MathAnswerReward",
    "PrefixMatchReward",
    "RegexFormatReward",
    "RewardBatch",
    "RewardErrorWarning",
    "RewardFailureError",
    "RewardFn",
    "RewardModelReward",
    "RewardPool",
    "RewardResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailableError",
    "TRLRewardAdapter",
    "TrainerState",
]
