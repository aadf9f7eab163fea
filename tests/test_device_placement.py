"""Device placement of every pass that runs a model, tested without a GPU (issue 36).

The real loop hands the Experience to the no-grad passes (old log-probs, reference log-probs, critic values,
teacher log-probs) as the rollout left it, on the CPU, while the models sit on the accelerator; only
``training_step`` moves it (``exp.to(self.device)``). A forward that moves one input and not another works on
a CPU-only machine and crashes on the first GPU iteration ("Expected all tensors to be on the same device"):
``padding_free`` did, packing a device ``input_ids`` with a CPU ``attention_mask``.

``tests/_fake_device.py`` is the stand-in accelerator: tensors on ``fakegpu:0`` that compute with the CPU's
kernels and raise CUDA's error when an op mixes them with (non-scalar) CPU tensors. Each case below runs the
passes with the model on that device and the Experience on the CPU, then one optimizer step's micro-batch
losses and gradients with the Experience moved, and compares every result with the same passes run all on the
CPU. The same body runs on real CUDA when there is one (``@pytest.mark.gpu``), to a float32 tolerance there.
The stand-in runs in a spawned worker process (``stand_in``): registering it is process-wide and permanent, so
the pytest process never imports it.

Covered: ``PolicyModule.on_experience`` (old log-probs, ``ppo_epochs: 2``; the critic's values, regression and
yes/no token heads), ``ReferenceKL`` (``reference_logprobs``, its ``loss`` term, and ``where="reward"`` with a
fresh policy forward), ``TeacherRouter`` (``on_experience``, a same-tokenizer in-memory teacher), a critic
with its own backbone, a reference kept on the CPU (``ReferenceKL(device="cpu")``), ``_micro_loss`` + backward
after ``exp.to(device)``; with and without ``padding_free``, ``share_prompt_forward`` on and off, fixed and
token-budget micro-batches. ``DistillModule``: teacher top-k, the OPD advantages' fresh student forward,
full-vocabulary terms. Found: the packed forward's CPU attention mask, old log-probs left on the device, the
OPD advantages' device log-probs. Not covered: cross-tokenizer teachers, the rollout engines, the eval
callback.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import multiprocessing
from types import SimpleNamespace

import pytest
import torch

from lit_rl.callbacks.reference_kl import ReferenceKL
from lit_rl.callbacks.teachers import Teacher, TeacherRouter
from lit_rl.learners import PolicyModule
from lit_rl.learners.critic import CriticModule
from lit_rl.rollout.engine import SamplingConfig
from tests._binding import bind_sampling
from tests.test_shared_prompt import COMPLETIONS, PROMPTS, _experience

REWARDS = [1.0, 0.0, 0.5, 1.0, 0.0, 0.25]


def _module(path, settings: dict) -> PolicyModule:
    head = settings.get("critic", "regression")
    own = {"share_backbone": False} if settings.get("critic_backbone") == "own" else {}  # a second model
    critic = (
        CriticModule(head="token", yes_token="Y", no_token="N", **own)
        if head == "token"
        else CriticModule(**own)
    )
    m = PolicyModule(
        model=str(path),
        critic=critic,
        advantage="gae",
        lam=0.95,
        ppo_epochs=settings.get("ppo_epochs", 2),
        optimizer=functools.partial(torch.optim.SGD, lr=0.0),
        micro_batch_size=4,
        padding_free=settings["padding_free"],
        share_prompt_forward=settings["share"],
        micro_batch_tokens=settings.get("micro_batch_tokens"),
    )
    m.model.config._attn_implementation = settings.get("attn", "sdpa")
    bind_sampling(m, SamplingConfig(**settings.get("sampling", {})))  # truncated sampling: the π^s passes too
    if head == "regression":  # the head starts at zero (V = 0 whatever the forward): give it weights to read
        with torch.no_grad():
            m.critic.head.weight.copy_(
                torch.linspace(-0.2, 0.2, m.critic.head.weight.numel()).view_as(m.critic.head.weight)
            )
    return m


def _passes(path, settings: dict, device: torch.device | None) -> dict[str, torch.Tensor]:
    """Every pass of one iteration with the policy (and reference, teacher) on ``device`` (None: the CPU) and
    the Experience on the CPU until the update; the results as CPU tensors."""
    m = _module(path, settings)
    where = settings.get("kl", "loss")  # reward: a penalty from the reference's and the policy's log-probs
    kl = ReferenceKL(
        kind="k1" if where == "reward" else "k3", where=where, beta=0.1, device=settings.get("ref_device")
    )  # "cpu": the reference stays off the accelerator
    kl.build_reference(m)  # as at ``setup``: copied before the strategy moves the policy
    router = TeacherRouter({"default": Teacher(model=copy.deepcopy(m.model))})
    m._trainer = SimpleNamespace(callbacks=[kl, router], world_size=1)  # what _micro_loss and the hooks read
    exp = _experience(PROMPTS, COMPLETIONS)
    exp.rewards = torch.tensor(REWARDS)
    if device is not None:
        m.to(device)  # the policy, its critic head; the reference and teacher follow it when first used
    exp.old_logprobs = None
    m.on_experience(m._trainer, m, exp)  # old log-probs (ppo_epochs 2) and the critic's values
    kl.on_experience(m._trainer, m, exp)  # reference log-probs
    router.on_experience(m._trainer, m, exp)  # teacher log-probs
    m.compute_advantages(exp)
    out = {
        "old_logprobs": exp.old_logprobs,
        "old_full_logprobs": exp.old_full_logprobs,
        "values": exp.values,
        "ref_logprobs": exp.ref_logprobs,
        "teacher_logprobs": exp.teacher_logprobs,
        "advantages": exp.advantages,
    }
    out = {k: v for k, v in out.items() if v is not None}  # one epoch: no old log-probs
    assert all(t.device.type == "cpu" for t in out.values())  # the Experience stays where the loop keeps it
    mb = exp.to(m.device).trim()  # training_step's move, then OptimizerStep's minibatch
    common = m._denominators(mb)
    losses = []
    for micro in m.train_micro_batches(mb):
        parts = m._micro_loss(micro, common)
        loss = sum(parts.values())
        loss.backward()
        losses.append(loss.detach())
    out["losses"] = torch.stack(losses)
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
        out["grad:" + name] = m.model.get_parameter(name).grad
    if settings.get("critic", "regression") == "regression":
        out["grad:critic.head.weight"] = m.critic.head.weight.grad
    assert all(v.device == m.device for k, v in out.items() if k == "losses" or k.startswith("grad:"))
    return {k: v.detach().cpu() for k, v in out.items()}


CASES = [
    {"padding_free": True, "share": True, "sampling": {"top_k": 5, "top_p": 0.9, "repetition_penalty": 1.3}},
    {"padding_free": True, "share": False, "micro_batch_tokens": 40, "critic_backbone": "own"},
    {"padding_free": True, "share": True, "micro_batch_tokens": 40, "critic": "token"},
    {"padding_free": False, "share": True, "ref_device": "cpu"},
    {"padding_free": False, "share": False, "micro_batch_tokens": 40, "critic": "token"},
    {"padding_free": True, "share": False, "attn": "eager"},  # no SDPA: the very same kernels, bit for bit
    # one epoch (no old log-probs) and the reward-form KL: its policy side is a fresh forward on the device
    {"padding_free": True, "share": True, "ppo_epochs": 1, "kl": "reward", "sampling": {"top_k": 5}},
]


def _case_id(s: dict) -> str:
    return "-".join(
        [
            ("packed" if s["padding_free"] else "padded"),
            ("shared" if s["share"] else "plain"),
            f"mbt{s.get('micro_batch_tokens')}",
            s.get("critic", "regression"),
            s.get("attn", "sdpa"),
            f"kl_{s.get('kl', 'loss')}",
            "processed" if s.get("sampling") else "softmax",
            f"critic_{s.get('critic_backbone', 'shared')}",
            f"ref_{s.get('ref_device', 'policy')}",
        ]
    )


def _check_same(got: dict, want: dict, **tol) -> None:
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].shape == w.shape, k
        torch.testing.assert_close(got[k], w, msg=k, **tol)
    assert float(want["ref_logprobs"].abs().sum()) > 0 and float(want["values"].abs().sum()) > 0


@contextlib.contextmanager
def _accelerator(kind: str):
    """The device of ``kind``: the stand-in, or a real GPU with TF32 off (its float32 matmuls as IEEE)."""
    if kind == "fakegpu":
        from tests._fake_device import fake_device  # only in the worker process: see ``stand_in``

        with fake_device() as dev:
            yield dev
        return
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        yield torch.device("cuda", 0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _on(kind: str, fn, *args):
    """``fn(*args, device)`` with the device of ``kind``."""
    with _accelerator(kind) as dev:
        return fn(*args, dev)


# Against the CPU run: the stand-in runs the CPU's kernels (SDPA's choice and last bits of a few backward
# kernels differ: see the test); CUDA's kernels sum in other orders.
TOL = {"fakegpu": {"rtol": 1e-6, "atol": 1e-6}, "cuda": {"rtol": 1e-4, "atol": 1e-5}}
DEVICES = ["fakegpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class _Worker:
    """A spawned process that runs the stand-in, started on first use. Registering ``fakegpu`` (PrivateUse1)
    is process-wide and permanent: ``torch.accelerator`` then answers ``fakegpu``, which transformers, pinned
    memory and the autograd engine's stream handling consult, so it must never happen in the pytest process
    that runs the rest of the suite (on a GPU machine, CUDA tests after it)."""

    def __init__(self):
        self.pool = None

    def run(self, kind: str, fn, *args):
        if kind != "fakegpu":
            return _on(kind, fn, *args)
        if self.pool is None:
            self.pool = multiprocessing.get_context("spawn").Pool(1)
        return self.pool.apply(_on, (kind, fn, *args))

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


@pytest.fixture(scope="module")
def stand_in():
    worker = _Worker()
    yield worker
    worker.close()


@pytest.mark.parametrize("settings", CASES, ids=_case_id)
@pytest.mark.parametrize("kind", DEVICES)
def test_passes_on_an_accelerator_equal_the_cpu(tiny_model_dir, stand_in, kind, settings):
    """Model on the device, Experience on the CPU: every pass runs, and gives the CPU's numbers.

    On the stand-in with eager attention the forwards run the very same CPU kernels: log-probs, values and
    losses are bit for bit the CPU's. SDPA picks its kernel by device (the CPU's fused kernel on the CPU, the
    math path on an unknown device), and some backward kernels differ in the last bit on the stand-in (the
    first difference is in SiLU's backward, 4e-9; not pinned down further): those agree to ~5e-7."""
    want = _passes(str(tiny_model_dir), settings, None)
    got = stand_in.run(kind, _passes, str(tiny_model_dir), settings)
    _check_same(got, want, **TOL[kind])
    if kind == "fakegpu" and settings.get("attn") == "eager":
        for k in want:
            assert k.startswith("grad:") or torch.equal(got[k], want[k]), k


def _distill_passes(path, padding_free: bool, device: torch.device | None) -> dict[str, torch.Tensor]:
    """DistillModule's passes: the teacher's log-probs and top-k (``TeacherRouter.on_experience``), the
    student's on-policy log-probs for the OPD advantages (one epoch: no old log-probs, no rollout log-probs),
    then the loss with full-vocabulary terms (the teacher's forward on the training micro-batch)."""
    from lit_rl.learners.distill import DistillModule

    losses = {"reverse_kl_sampled": 1.0, "topk_reverse_kl": 0.5, "forward_kl": 0.5}
    m = DistillModule(
        model=str(path),
        losses=losses,
        topk=4,
        padding_free=padding_free,
        optimizer=functools.partial(torch.optim.SGD, lr=0.0),
    )
    teacher = copy.deepcopy(m.model)
    with torch.no_grad():  # a teacher that differs from the student: every term is non-zero
        teacher.get_input_embeddings().weight.mul_(1.5)
    router = TeacherRouter({"default": Teacher(model=teacher)})
    m._trainer = SimpleNamespace(callbacks=[router], world_size=1)
    bind_sampling(m, teacher_router=router)  # what RolloutCallback.setup binds
    exp = _experience(PROMPTS, COMPLETIONS)
    if device is not None:
        m.to(device)
    router.on_experience(m._trainer, m, exp)
    m.compute_advantages(exp)
    out = {
        "teacher_logprobs": exp.teacher_logprobs,
        "opd_advantages": exp.extras["opd_advantages"],
        "teacher_topk_logprobs": exp.extras["teacher_topk_logprobs"],
    }
    mb = exp.to(m.device).trim()
    common = m._denominators(mb)
    loss = sum(sum(m._micro_loss(micro, common).values()) for micro in m.train_micro_batches(mb))
    loss.backward()
    out["loss"] = loss
    out["grad:embed"] = m.model.get_input_embeddings().weight.grad
    return {k: v.detach().cpu() for k, v in out.items()}


@pytest.mark.parametrize("padding_free", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("kind", DEVICES)
def test_distill_passes_on_an_accelerator_equal_the_cpu(tiny_model_dir, stand_in, kind, padding_free):
    want = _distill_passes(str(tiny_model_dir), padding_free, None)
    got = stand_in.run(kind, _distill_passes, str(tiny_model_dir), padding_free)
    assert set(got) == set(want) and float(want["opd_advantages"].abs().sum()) > 0
    for k, w in want.items():
        torch.testing.assert_close(got[k], w, msg=k, **TOL[kind])


def test_stand_in_fails_like_cuda(stand_in):
    """The stand-in's own contract: the errors CUDA raises, and what CUDA allows (no false alarm)."""
    stand_in.run("fakegpu", _stand_in_contract)
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"  # this process never registered it


def _stand_in_contract(dev):
    """Runs in the worker: the device is ``fakegpu:0``."""
    from tests._fake_device import FakeDeviceTensor

    a = torch.arange(6.0).view(2, 3).to(dev)
    assert isinstance(a, FakeDeviceTensor) and a.device == dev and not a.is_cpu
    for bad in (
        lambda: a + torch.ones(2, 3),
        lambda: torch.cat([a, torch.ones(2, 3)]),
        lambda: torch.ones(2, 3).masked_fill(a > 2, 0.0),
        lambda: torch.ones(3)[a[0].long()],
    ):
        with pytest.raises(RuntimeError, match="same device|indices should be"):
            bad()
    # allowed as on CUDA: a 0-dim CPU operand, CPU indices and masks, copies, host reads
    assert (a * torch.tensor(2.0)).cpu().tolist() == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]
    assert a[torch.tensor([True, False])].device == dev
    assert a[torch.tensor([1])].tolist() == [[3.0, 4.0, 5.0]]
    a[torch.tensor([0])] = 7.0
    b = torch.zeros(2, 3, device=dev).copy_(torch.ones(2, 3))
    assert a.sum().item() == 33.0 and b.sum().item() == 6.0
    assert torch.tensor([1, 2], device=dev).device == dev
    assert a.nonzero().shape == (6, 2) and bool((a > 0).any())
    with pytest.raises(TypeError, match="numpy"):
        a.numpy()
    lin = torch.nn.Linear(3, 2).to(dev)
    assert isinstance(lin.weight, torch.nn.Parameter) and lin.weight.device == dev
    lin(a).sum().backward()
    assert lin.weight.grad.device == dev
    tied = torch.nn.Sequential(torch.nn.Embedding(4, 3), torch.nn.Linear(3, 4, bias=False))
    tied[1].weight = tied[0].weight
    tied.to(dev)  # swapped in place: still one Parameter (an LM head tied to its embedding)
    assert tied[1].weight is tied[0].weight and tied[0].weight.device == dev
