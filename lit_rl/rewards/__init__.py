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

__all__ = ["RewardFn", "RewardResult", "RewardPool", "RewardBatch", "RewardErrorWarning", "RewardFailureError",
           "TRLRewardAdapter", "TrainerState", "ExactAnswerReward", "LastIntReward", "MathAnswerReward",
           "PrefixMatchReward", "RegexFormatReward", "CodeTestsReward", "Sandbox", "SandboxLimits",
           "SandboxUnavailableError", "RewardModelReward"]
