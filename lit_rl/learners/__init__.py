from lit_rl.learners.critic import CriticModule
from lit_rl.learners.distill import DistillModule
from lit_rl.learners.policy import PolicyModule
from lit_rl.learners.protocols import ExperienceHook, LossTerm
from lit_rl.learners.reward_model import RewardModelModule
from lit_rl.learners.schedules import CosineDecay, WarmupLinearDecay

__all__ = [
    "CosineDecay",
    "CriticModule",
    "DistillModule",
    "ExperienceHook",
    "LossTerm",
    "PolicyModule",
    "RewardModelModule",
    "WarmupLinearDecay",
]
