"""What a Ray job of hvdprof needs to know besides its workers: timeouts and outputs.

Horovod's ``RayExecutor.create_settings(timeout_s=...)`` returns a settings object that
the executor receives, so a Horovod user's driver script keeps working; ours holds only
what hvdprof uses. Horovod's SSH and NIC options mean nothing to Ray actors (Ray already
reaches every node): they are accepted and ignored so such scripts still run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RaySettings:
    """Timeouts and outputs of a Ray job (``RayExecutor.create_settings``)."""

    #: how long the ranks may take to meet in ``hvd.init()`` (the workers'
    #: ``HVDPROF_START_TIMEOUT_SECONDS``; a rank later than that is named as the failure),
    #: and, plus 30 s, how long ``shutdown()`` waits for the timelines. It does not bound
    #: the user's function: ``run()`` waits as long as that runs
    timeout_s: float = 30.0
    #: how long ``start()`` waits for Ray to place the workers; then ``TimeoutError``
    placement_group_timeout_s: float = 100.0
    #: a directory on the driver's machine: every rank's timeline is gathered there at
    #: ``shutdown()``. None: ``HVDPROF_TIMELINE`` (or ``HOROVOD_TIMELINE``) of the driver
    timeline: str | None = None
    #: after a worker dies, how long the other ranks get to end on their own (their
    #: collectives fail) before their actors are killed
    failure_grace_s: float = 10.0
    #: how often the driver checks its workers while a function runs
    poll_s: float = 0.2
    verbose: bool = False


def create_settings(
    timeout_s: float = 30.0,
    placement_group_timeout_s: float = 100.0,
    *,
    timeline: str | None = None,
    failure_grace_s: float = 10.0,
    verbose: bool = False,
    ssh_identity_file: str | None = None,
    ssh_str: str | None = None,
    nics: object = None,
) -> RaySettings:
    """Horovod's ``create_settings``: its SSH and NIC arguments are accepted, unused."""
    del ssh_identity_file, ssh_str, nics
    if not timeout_s > 0 or not placement_group_timeout_s > 0:
        raise ValueError(
            f"timeout_s={timeout_s!r} and placement_group_timeout_s="
            f"{placement_group_timeout_s!r} must be seconds > 0"
        )
    return RaySettings(
        timeout_s=float(timeout_s),
        placement_group_timeout_s=float(placement_group_timeout_s),
        timeline=timeline,
        failure_grace_s=float(failure_grace_s),
        verbose=verbose,
    )
