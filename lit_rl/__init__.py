__version__ = "0.1.0"

# Lightning's cloud tips, its pytree deprecation warning, DeepSpeed's accelerator notice, ...: the known messages of
# the libraries underneath that the CLI drops are dropped for lit_rl used as a library too (LIT_RL_VERBOSE=1
# keeps them). Light: logging and warnings filters and environment defaults, no library is imported.
import lit_rl.cli.quiet as _quiet  # the submodule itself: `from lit_rl.cli import` would load the CLI app

_quiet.install(transformers_bars=False)
