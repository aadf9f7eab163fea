"""Wall-clock limits for reward and sandbox tests of programs that are expected to finish.

A test that checks *what* a program scores must not depend on *how fast* the machine runs it: on a loaded
machine (a busy CI host, the suite beside a training run) one sandboxed interpreter start can stall for
seconds, and a tight program budget then turns passing tests into "not run: budget spent" failures
(``assert 0.25 == 0.875`` in tests/agent/test_retry_env.py, seen under load). Such tests give the sandbox and
the reward's program budget ``FINISH_S``: far above any load, reached only by a program that hangs. Tests of
the timeouts themselves run hanging programs (they time out at any speed) with their own short limits. CPU
limits (``SandboxLimits.cpu_s``, RLIMIT_CPU) count CPU time, which load does not stretch.
"""

FINISH_S = 60.0
