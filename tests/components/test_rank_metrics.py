"""``modules.rank_metrics.reduce_over_ranks`` with 2 real gloo processes: a NaN or a missing key on one rank is
"no value there" (before: a NaN metric was skipped by that rank alone, so the ranks ran different numbers of
``sync_dist`` collectives, mixing metrics up and hanging the next other collective)."""
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # ~30 s on 2 shared cores (two Lightning imports)

_CHILD = '''
import json, math, sys
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lit_rl.modules.rank_metrics import reduce_over_ranks

dist.init_process_group("gloo")
nan = math.nan
mine = [
    {"reward/mean": 1.0, "rollout/response_len_stopped_mean": nan, "rollout/response_len_stopped_max": 3.0,
     "rollout/response_len_stopped_min": nan, "adv/min": -2.0},
    {"reward/mean": 3.0, "rollout/response_len_stopped_mean": 5.0, "rollout/response_len_stopped_max": nan,
     "rollout/response_len_stopped_min": 4.0, "adv/min": -1.0, "only/rank1": 7.0, "all/nan": nan},
][dist.get_rank()]
if dist.get_rank() == 0:
    mine["all/nan"] = nan
out = reduce_over_ranks(DDPStrategy(), mine, "cpu")
dist.barrier()  # both ranks got here: no collective left unpaired
print("OUT" + str(dist.get_rank()) + " " + json.dumps(out, sort_keys=True), flush=True)
'''


def test_nan_and_missing_metrics_reduce_over_the_ranks_that_have_them(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    # hand-computed: mean over the ranks with a value, max / min over those, a key nobody has stays out
    want = ('{"adv/min": -2.0, "only/rank1": 7.0, "reward/mean": 2.0, "rollout/response_len_stopped_max": 3.0, '
            '"rollout/response_len_stopped_mean": 5.0, "rollout/response_len_stopped_min": 4.0}')
    for r, out in enumerate(outs):
        assert f"OUT{r} {want}" in out, out[-3000:]
