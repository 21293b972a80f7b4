"""Horovod's semantics where a script can notice them, at 2 ranks with real processes.

``workers/semantics_worker.py`` checks each area in a section of its own: int16 and
every dtype of the runtime's table through every op (bool and the rest refused), integer
averages truncating toward zero, the gradient of every op Horovod makes differentiable
(grouped allreduce included, also by finite differences of the global loss), Adasum
against Horovod's reference tree reduction and the delta optimizer of
``DistributedOptimizer(op=Adasum)``, and the API's return types and ``process_set=``.

Two configurations: the default runtime (small buffers over the control channel's
sockets, large ones through shared memory) and everything through Gloo with the response
cache off. A third job at 3 ranks checks Adasum's clear error when the ranks are not a
power of two.
"""

from __future__ import annotations

import pytest
from conftest import JobResult, run_job

pytestmark = pytest.mark.timeout(300)

CONFIGS = {
    "default": {},
    "gloo-no-cache": {
        "HVDPROF_BACKEND": "gloo",
        "HVDPROF_SMALL_ALLREDUCE_BYTES": "0",
        "HVDPROF_CACHE_CAPACITY": "0",
    },
}

SECTIONS = {
    "int16_everywhere": "int16 through allreduce (4 ops, small and large), allgather, "
    "broadcast, alltoall (with and without splits), reducescatter, grouped; sums wrap",
    "dtype_table": "every dtype of the runtime's table through allreduce, allgather, "
    "broadcast and alltoall; bool, complex64, uint16, uint32 refused with a clear error",
    "integer_average": "Average on integers truncates toward zero (-75 / 2 = -37), small "
    "and large tensors, with prescale/postscale, reducescatter and grouped",
    "autograd_grouped_allreduce": "grouped_allreduce backward = grouped allreduce of the "
    "gradients with the same op and scale factors (closed form, finite differences)",
    "autograd_allreduce": "allreduce backward with scale factors, finite differences",
    "autograd_others": "allgather, grouped_allgather, broadcast, alltoall, reducescatter, "
    "grouped_reducescatter gradients as Horovod defines them",
    "adasum": "op=Adasum equals Horovod's reference tree reduction (fp16/bf16 within 1e-2), "
    "grouped and in place, 100,000 floats; orthogonal add, identical average; ints refused",
    "adasum_optimizer": "DistributedOptimizer(op=Adasum): start + Adasum(local deltas), equal "
    "on every rank, 3 steps of SGD with momentum",
    "api": "synchronize of grouped ops gives a tuple, grouped_allreduce a list, "
    "alltoall_async a pair; process_set= global accepted everywhere, others refused",
}

_jobs: dict[str, JobResult] = {}


def _job(config: str) -> JobResult:
    if config not in _jobs:
        _jobs[config] = run_job("semantics_worker.py", 2, "all", env=CONFIGS[config])
    return _jobs[config]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("section", list(SECTIONS))
def test_semantics(config: str, section: str) -> None:
    _job(config).assert_section(section, 2)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_rank_finished(config: str) -> None:
    _job(config).assert_done(2)


def test_adasum_needs_a_power_of_two_number_of_ranks() -> None:
    job = run_job("semantics_worker.py", 3, "not_power_of_two")
    job.assert_section("adasum_not_power_of_two", 3)
    job.assert_done(3)
