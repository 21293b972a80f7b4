"""hvdprof on a Ray cluster: Horovod's ``horovod.ray`` for hvdprof jobs.

``RayExecutor`` runs a fixed number of ranks as Ray actors; ``ElasticRayExecutor`` an
elastic job whose workers may die or be added, sized from Ray's view of the cluster.
Needs ``pip install 'hvdprof[ray]'``; nothing in hvdprof imports this package.
"""

from __future__ import annotations

from hvdprof.ray.elastic import ElasticRayExecutor
from hvdprof.ray.executor import RayExecutor
from hvdprof.ray.failures import WorkerFailedError
from hvdprof.ray.settings import RaySettings, create_settings
from hvdprof.ray.worker import BaseHorovodWorker, RayWorker

__all__ = [
    "BaseHorovodWorker",
    "ElasticRayExecutor",
    "RayExecutor",
    "RaySettings",
    "RayWorker",
    "WorkerFailedError",
    "create_settings",
]
