"""``DistributedOptimizer`` at 2 ranks trains exactly like one process on the whole batch.

One launch of ``workers/train_worker.py``; each test asserts one of its sections on
every rank. Each training case starts every rank from a different random model,
broadcasts rank 0's parameters and optimizer state, trains a few steps on per-rank
slices of a global batch, and compares the weights with a plain-torch reference that
trained on the whole batch (tolerance 1e-5; 1e-3 with fp16 compression), and with
every other rank's (exactly).
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


@pytest.fixture(scope="module")
def train_job() -> JobResult:
    return run_job("train_worker.py", NUM_PROC, timeout=180)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_training(train_job: JobResult, section: str) -> None:
    train_job.assert_section(section, NUM_PROC)


def test_training_job_completes(train_job: JobResult) -> None:
    train_job.assert_done(NUM_PROC)
