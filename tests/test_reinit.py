"""``init()`` after ``shutdown()``: a loop of 50 init/op/shutdown cycles, real processes.

Horovod's own tests call ``hvd.barrier(); hvd.shutdown()`` after every test and
``hvd.init()`` before the next. A rank must never connect to a previous incarnation's
address (the bug: rank 1's tenth ``init()`` failed with "Connection refused"), so each
``init()`` meets the others under its own key prefix in a store that outlives
``shutdown()`` (``hvdprof/runtime/runtime.py``). The worker makes rank 0 linger before
every other shutdown so that the other ranks always race ahead into their next ``init()``.
"""

from __future__ import annotations

import pytest
from conftest import run_job

CYCLES = 50


@pytest.mark.parametrize("num_proc", [2, 3])
def test_fifty_init_op_shutdown_cycles(num_proc: int) -> None:
    result = run_job("reinit_worker.py", num_proc, str(CYCLES), timeout=240)
    result.assert_section("reinit_loop", num_proc)
    result.assert_done(num_proc)
    for rank in range(num_proc):
        assert result.values(rank, "CYCLES_COMPLETED") == [str(CYCLES)], result.describe()
