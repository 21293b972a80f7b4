"""``DistributedOptimizer`` at 2 ranks trains exactly like one process on the whole batch.

One launch of ``workers/train_worker.py``; each test asserts one of its sections on
every rank. Each training case starts every rank from a different random model,
broadcasts rank 0's parameters and optimizer state, trains a few steps on per-rank
slices of a global batch, and compares the weights with a plain-torch reference that
trained on the whole batch (tolerance 1e-5; 1e-3 with fp16 compression), and with
every other rank's (exactly).

The job runs three times: gradients in the default buckets, one allreduce per gradient
(``HVDPROF_BUCKET_BYTES=0``, Horovod's way) and small buckets (several per model, some of
one parameter). Bucketing is an implementation detail: every case's final weights must be
bit-identical across the three.
"""

from __future__ import annotations

import pytest
from conftest import JobResult, run_job

pytestmark = pytest.mark.timeout(300)

NUM_PROC = 2

SECTIONS = {
    "sgd_mlp": "SGD with momentum, an MLP",
    "adam_convnet": "Adam, a small conv net",
    "sgd_convnet": "SGD with momentum, the conv net",
    "adam_mlp": "Adam, the MLP",
    "sgd_backward_passes_2": "backward_passes_per_step=2: two micro-batches, loss / 2",
    "adam_backward_passes_2": "the same with Adam and the conv net",
    "sgd_predivide": "gradient_predivide_factor=2.0 gives the same average",
    "sgd_fp16_compression": "compression=hvd.Compression.fp16, looser tolerance",
    "adam_fp16_compression": "fp16 compression with Adam",
    "sgd_keep_grads": "zero_grad(set_to_none=False): gradients kept and zeroed in place "
    "step after step",
    "adam_keep_grads_backward_passes_2": "the same with two micro-batches, Adam, conv net",
    "sgd_channels_last": "a channels_last conv net: its weights and gradients are not "
    "contiguous (broadcast_parameters and one allreduce per gradient once raised "
    "'requires a contiguous tensor')",
    "groups": "Horovod's groups=: bad values are a ValueError, num_groups is deprecated "
    "but still groups, an integer and lists of parameters train like one process",
    "unused_parameter": "a parameter that never gets a gradient: its bucket is completed "
    "with zeros in step() and training matches one process",
    "optimizer_safety": "zero_grad with pending handles: AssertionError; duplicate and "
    "missing names: ValueError; too many backward passes: AssertionError; step() after "
    "synchronize() warns, not inside "
    "skip_synchronize(); averaged gradients identical on every rank",
    "misuse_after_reduction": "a second backward() while the first one's allreduces are "
    "in flight (forced: rank 0 is held back) raises and leaves every gradient as it was",
    "sparse_allreduce": "hvd.sparse_allreduce_async sums / averages every rank's sparse rows",
    "sparse_embedding": "nn.Embedding(sparse=True) trains like dense training in one process",
    "sparse_as_dense": "the same with DistributedOptimizer(sparse_as_dense=True)",
    "sync_batch_norm": "hvd.SyncBatchNorm on per-rank slices equals BatchNorm in one process "
    "on the whole batch: outputs, gradients, running statistics",
    "optimizer_state_without_grads": "broadcast_optimizer_state before any step with a "
    "parameter that needs no gradient; reducescatter with Adasum is a RuntimeError",
}


#: HVDPROF_BUCKET_BYTES per launch: the default, none (one allreduce per gradient) and
#: small buckets (the MLP's and the conv net's parameters split over several)
BUCKETS = {"default": None, "per_gradient": "0", "small": "600"}
_jobs: dict[str, JobResult] = {}


def _job(buckets: str) -> JobResult:
    if buckets not in _jobs:
        value = BUCKETS[buckets]
        env = None if value is None else {"HVDPROF_BUCKET_BYTES": value}
        _jobs[buckets] = run_job("train_worker.py", NUM_PROC, env=env, timeout=180)
    return _jobs[buckets]


@pytest.fixture(scope="module", params=list(BUCKETS))
def train_job(request: pytest.FixtureRequest) -> JobResult:
    return _job(request.param)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_training(train_job: JobResult, section: str) -> None:
    train_job.assert_section(section, NUM_PROC)


def test_training_job_completes(train_job: JobResult) -> None:
    train_job.assert_done(NUM_PROC)


def _weights(job: JobResult) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in job.values(0, "WEIGHTS"))


def test_buckets_change_no_bit() -> None:
    """Every case ends with the same weights, bit for bit, however gradients are bucketed."""
    per_gradient = _weights(_job("per_gradient"))
    assert len(per_gradient) >= 10, _job("per_gradient").describe()
    for name in ("default", "small"):
        other = _weights(_job(name))
        differ = sorted(c for c in per_gradient if other.get(c) != per_gradient[c])
        assert not differ, f"{name} buckets: weights differ from per-gradient in {differ}"


def test_buckets_cut_ops() -> None:
    """The default buckets reduce the conv net's 6 gradients in two ops a step, not 6: the
    first gradient backward produces alone, the other 5 in one bucket."""
    ops = {
        name: dict(line.split(" ", 1) for line in _job(name).values(0, "OPS"))
        for name in ("default", "per_gradient")
    }
    assert int(ops["per_gradient"]["sgd_convnet"]) == 6 * 6, ops
    assert int(ops["default"]["sgd_convnet"]) == 6 * 2, ops
