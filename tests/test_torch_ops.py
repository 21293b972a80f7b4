"""Every op of ``hvdprof.torch``, every dtype, at 2 and 3 ranks, checked numerically.

One launch per configuration runs ``workers/ops_worker.py``, which checks each area in
a section of its own; every test below asserts one section on every rank. The three
configurations cover the default runtime (fusion and response cache on), a tiny
fusion buffer with a short pipeline and a small response cache at 3 ranks (many
groups, tensors larger than the buffer reduced alone, names beyond the cache's
capacity negotiated every time), and fusion and the cache both off (every op
negotiated by the coordinator, reduced on its own).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import JobResult, run_job

pytestmark = pytest.mark.timeout(300)

CONFIGS = {
    "2ranks": (2, {}),
    "3ranks-small-fusion-buffer-small-cache": (
        3,
        {
            "HVDPROF_FUSION_THRESHOLD": "256",
            "HVDPROF_MAX_INFLIGHT": "2",
            "HVDPROF_CACHE_CAPACITY": "64",
        },
    ),
    "2ranks-no-fusion-no-cache": (
        2,
        {
            "HVDPROF_FUSION_THRESHOLD": "0",
            "HVDPROF_CACHE_CAPACITY": "0",
            "HVDPROF_SMALL_ALLREDUCE_BYTES": "0",  # every allreduce through Gloo:
            "HVDPROF_BACKEND": "gloo",  # not the sockets, not shared memory
        },
    ),
}

#: section name in the worker -> what it covers (for the reader; the ids are the names)
SECTIONS = {
    "topology": "init twice is a no-op, is_initialized, size/rank/local_*/cross_*",
    "allreduce_blocking": "allreduce and allreduce_: 5 ops x every dtype, input untouched / in place",
    "allreduce_async_many": "allreduce_async and allreduce_async_: 80 ops in flight at once",
    "allreduce_options": "prescale/postscale, default op, deprecated average= (warns, "
    "ValueError with op=), fp16 compression, scalar/4-d/empty/non-contiguous tensors",
    "allreduce_autograd": "allreduce is differentiable: backward is an allreduce of the grad",
    "grouped_allreduce": "grouped_allreduce (+_, async, async_), mixed dtypes, compression",
    "allgather": "allgather (+async), first dims differing across ranks (one empty), every dtype",
    "broadcast": "broadcast, broadcast_, broadcast_async(_) from every root, every dtype",
    "alltoall": "alltoall with splits (list, tensor; zero splits) -> (output, received "
    "splits), without splits -> output, async forms, every dtype",
    "reducescatter": "reducescatter: 5 ops x every dtype x row counts (uneven, fewer rows than "
    "ranks), extra rows to low ranks, async, default op, scaling, compression",
    "barrier": "barrier holds every rank until the last one arrives",
    "poll_synchronize": "poll becomes True, then synchronize returns the result",
    "names_and_cache": "a given name is kept, an unnamed loop reuses one generated name "
    "(cache hits grow, entries do not), two unnamed ops in flight",
    "many_in_flight_fusion": "900 async allreduces in flight (3 dtypes, in place and not) "
    "plus one big tensor; fused_groups > 0, fused_tensors > fused_groups, cache hits",
    "functions": "broadcast_parameters (state_dict and named_parameters), "
    "broadcast_optimizer_state, broadcast_object, allgather_object",
    "autograd_like_horovod": "allgather/broadcast backward average the grad as "
    "horovod.torch does; alltoall is differentiable",
    "join": "early join contributes zeros (cached and new names, grouped, Max); join returns "
    "the last rank to join (rank 1, made to join last); allreduce works normally afterwards",
    "shutdown": "shutdown leaves the process uninitialized",
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def ops_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    num_proc, env = CONFIGS[request.param]
    shared: Path = tmp_path_factory.mktemp(f"ops-{request.param}")
    result: JobResult = run_job("ops_worker.py", num_proc, str(shared), env=env)
    return num_proc, result


@pytest.mark.parametrize("section", list(SECTIONS))
def test_ops(ops_job: tuple[int, JobResult], section: str) -> None:
    num_proc, result = ops_job
    result.assert_section(section, num_proc)


def test_ops_job_completes(ops_job: tuple[int, JobResult]) -> None:
    """Every rank got through every section and the launcher exited 0."""
    num_proc, result = ops_job
    result.assert_done(num_proc)
