from lit_rl.modules.critic import CriticModule
from lit_rl.modules.distill import DistillModule
from lit_rl.modules.policy import PolicyModule
from lit_rl.modules.protocols import ExperienceHook, LossTerm
from lit_rl.modules.reward_model import RewardModelModule
from lit_rl.modules.schedules import CosineDecay, WarmupLinearDecay

__all__ = ["PolicyModule", "CriticModule", "RewardModelModule", "ExperienceHook", "LossTerm", "DistillModule",
           "CosineDecay", "WarmupLinearDecay"]
