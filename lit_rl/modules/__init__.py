from lit_rl.modules.policy import PolicyModule
from lit_rl.modules.protocols import ExperienceHook, LossTerm

__all__ = ["PolicyModule", "ExperienceHook", "LossTerm"]
