"""Helpers shared by the torch worker scripts (imported as ``_common`` from their folder).

A worker runs named sections of checks. A failed check is recorded, not raised, so
every rank keeps taking the same path through the collectives and the later sections
still run; each section ends with one line the tests parse:

    SECTION <name> OK <checks>
    SECTION <name> FAIL <failed>/<checks>: <first failures>

An exception escaping a section is reported the same way (with its traceback on
stderr) and the worker moves on. ``DONE`` ends a worker that got through every
section. A watchdog ends the process if it outlives ``HVDTEST_DEADLINE_S``, so even a
worker that hangs where the launcher cannot see it never outlives the test.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

WATCHDOG_EXIT = 98


def start_watchdog() -> None:
    limit = float(os.environ.get("HVDTEST_DEADLINE_S", "300"))

    def expire() -> None:
        print(f"watchdog: worker still running after {limit:g} s, exiting", file=sys.stderr)
        sys.stderr.flush()
        os._exit(WATCHDOG_EXIT)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()


def expected_allreduce(values: Any, op: str, dtype: Any) -> Any:
    """What allreduce with Horovod's ``op`` gives for ``values`` (ranks first, float64):
    the reference every worker checks its results against. Integer Average truncates
    toward zero, as Horovod's does (-75 / 2 = -37)."""
    import torch

    ranks = values.shape[0]
    if op in ("Sum", "Average"):
        out = values.sum(0)
        if op == "Average":
            out = out / ranks if dtype.is_floating_point else torch.trunc(out / ranks)
    elif op == "Min":
        out = values.min(0).values
    elif op == "Max":
        out = values.max(0).values
    else:
        out = values.prod(0)
    return out


def allreduce_named_gradients(
    hvd: Any, grads: list[Any], names: list[str], ck: Checks, step: int
) -> None:
    """One step of the named-gradient workloads: every rank fills gradient ``i`` with
    ``rank + i``, allreduces them all asynchronously (Sum) and checks every sum."""
    import torch

    rank, size = hvd.rank(), hvd.size()
    for i, g in enumerate(grads):
        g.fill_(float(rank + i))
    handles = [
        hvd.allreduce_async_(g, name=n, op=hvd.Sum) for g, n in zip(grads, names, strict=True)
    ]
    for h in handles:
        hvd.synchronize(h)
    want = [size * i + size * (size - 1) / 2 for i in range(len(grads))]
    bad = [i for i, g in enumerate(grads) if not bool(torch.all(g == want[i]))]
    ck.true(not bad, f"step {step}: sums of {bad} are wrong")


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Checks:
    """Counts checks per section and records failures with what was expected and seen."""

    def __init__(self, rank: int | None = None) -> None:
        self.rank = rank
        self.count = 0
        self.failures: list[str] = []
        self.failed_sections: list[str] = []

    # ------------------------------------------------------------ sections
    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        self.count = 0
        self.failures = []
        try:
            yield
        except Exception as exc:
            traceback.print_exc()
            self.failures.append(f"raised {type(exc).__name__}: {exc}")
        if self.failures:
            self.failed_sections.append(name)
            shown = " | ".join(_one_line(f) for f in self.failures[:4])
            more = f" (+{len(self.failures) - 4} more)" if len(self.failures) > 4 else ""
            print(
                f"SECTION {name} FAIL {len(self.failures)}/{max(self.count, 1)}: {shown}{more}",
                flush=True,
            )
        else:
            print(f"SECTION {name} OK {self.count}", flush=True)

    def done(self) -> None:
        print("DONE", flush=True)

    # ------------------------------------------------------------ checks
    def fail(self, what: str, detail: str) -> None:
        self.failures.append(f"rank {self.rank}: {what}: {detail}")

    def true(self, cond: Any, what: str) -> bool:
        self.count += 1
        if not cond:
            self.fail(what, "condition is false")
            return False
        return True

    def eq(self, actual: Any, expected: Any, what: str) -> bool:
        self.count += 1
        if actual != expected:
            self.fail(what, f"expected {expected!r}, got {actual!r}")
            return False
        return True

    def tensor(
        self,
        actual: Any,
        expected: Any,
        what: str,
        rtol: float = 0.0,
        atol: float = 0.0,
    ) -> bool:
        """Same dtype, same shape, values equal (within the tolerance for floats)."""
        import torch

        self.count += 1
        if not isinstance(actual, torch.Tensor):
            self.fail(what, f"expected a tensor, got {type(actual).__name__}: {actual!r}")
            return False
        if actual.dtype != expected.dtype:
            self.fail(what, f"dtype {actual.dtype}, expected {expected.dtype}")
            return False
        if tuple(actual.shape) != tuple(expected.shape):
            self.fail(what, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
            return False
        if not torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol):
            self.fail(what, f"got {actual.tolist()}, expected {expected.tolist()}")
            return False
        return True

    def raises(
        self, exc_type: type[BaseException], fn: Callable[[], Any], *contains: str, what: str = ""
    ) -> BaseException | None:
        """``fn()`` raises ``exc_type`` whose message contains every string in ``contains``."""
        self.count += 1
        what = f"{what + ': ' if what else ''}expected {exc_type.__name__}"
        try:
            fn()
        except exc_type as exc:
            text = str(exc)
            missing = [part for part in contains if part not in text]
            if missing:
                self.fail(what, f"{missing!r} not in the message {text!r}")
            return exc
        except Exception as exc:
            self.fail(what, f"got {type(exc).__name__}: {exc}")
            return None
        self.fail(what, "nothing was raised")
        return None
