"""``TorchState``: what an elastic job keeps across a reset, and how it is made consistent.

``commit()`` copies the model, optimizer, samplers and plain attributes to host memory;
``restore()`` puts the last copy back after a failed collective (the uncommitted batch is
lost, nothing else); ``sync()`` makes every rank of a new generation equal to its rank 0
(the lowest surviving rank, which holds the committed state).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch

from hvdprof.runtime import elastic as _membership
from hvdprof.torch.elastic.sampler import ElasticSampler
from hvdprof.torch.functions import (
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvdprof.torch.mpi_ops import Max, allreduce, size


class HostsUpdatedInterrupt(RuntimeError):
    """Workers were added to (or removed from) the job: every rank leaves the training
    function at the same ``commit()``/``check_host_updates()`` and the job re-forms.

    ``skip_sync`` is True when the change only removed workers: the state of the
    survivors is already consistent, so it need not be broadcast again.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of the elastic job were updated")
        self.skip_sync = skip_sync


class State:
    """Base of elastic states: commit/restore/sync of attributes, reset callbacks."""

    def __init__(self, **kwargs: Any) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._attr_names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved: dict[str, Any] = {}
        #: seconds the last commit() spent copying state (the rest is the host check)
        self.last_commit_copy_s = 0.0

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called after every reset (e.g. to rescale the learning rate by size())."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state (the point a failure rolls back to), then check for new hosts."""
        t0 = time.perf_counter()
        self.save()
        self.last_commit_copy_s = time.perf_counter() - t0
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank at once when the launcher has
        published a newer generation (workers joined or left).

        Collective: each rank reads the newest generation and the ranks agree on the
        maximum, so no rank leaves the training loop alone.
        """
        m = _membership.membership()
        if m is None or size() < 1:
            return
        newest = _membership.newest_generation()
        agreed = int(
            allreduce(
                torch.tensor([newest], dtype=torch.int64), op=Max, name="elastic.host_updates"
            ).item()
        )
        if agreed > m.generation:
            pending = _membership.plan(agreed)["workers"]
            raise HostsUpdatedInterrupt(skip_sync=set(pending) <= set(m.workers))

    def save(self) -> None:
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._attr_names}

    def restore(self) -> None:
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))

    def sync(self) -> None:
        """Every rank takes rank 0's values; then they are the committed state."""
        if self._attr_names and size() > 1:
            values = broadcast_object(
                {name: getattr(self, name) for name in self._attr_names},
                0,
                name="elastic.state.attributes",
            )
            for name, value in values.items():
                setattr(self, name, value)
        self.save()


class ObjectState(State):
    """Plain Python attributes only (Horovod's ``ObjectState``)."""


class TorchState(State):
    """Model, optimizer, ``ElasticSampler`` keyword arguments and plain attributes.

    ``TorchState(model, optimizer, epoch=0, batch=0)``: ``state.epoch`` and
    ``state.batch`` are plain attributes, committed and restored with the rest.
    """

    def __init__(
        self, model: torch.nn.Module | None = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers}
        for name, sampler in self._samplers.items():
            object.__setattr__(self, name, sampler)
        self._model_saved: dict[str, Any] | None = None
        self._optimizer_saved: dict[str, Any] | None = None
        self._samplers_saved: dict[str, dict[str, Any]] = {}
        super().__init__(**plain)

    def save(self) -> None:
        # Into the buffers of the previous commit: allocating ~200 MB anew per commit
        # (a ResNet-50 with momentum) costs page faults on every page, every time.
        if self.model is not None:
            self._model_saved = _copy_into(self._model_saved, self.model.state_dict())
        if self.optimizer is not None:
            self._optimizer_saved = _copy_into(self._optimizer_saved, self.optimizer.state_dict())
        self._samplers_saved = {k: s.state_dict() for k, s in self._samplers.items()}
        super().save()

    def restore(self) -> None:
        if self.model is not None and self._model_saved is not None:
            self.model.load_state_dict(self._model_saved)
        if self.optimizer is not None:
            if self._optimizer_saved is not None:
                self.optimizer.load_state_dict(copy.deepcopy(self._optimizer_saved))
            _forget_pending_reductions(self.optimizer)
        for name, saved in self._samplers_saved.items():
            self._samplers[name].load_state_dict(saved)
        super().restore()

    def on_reset(self) -> None:
        if self.optimizer is not None:  # (also when sync() is skipped)
            _match_hooks_to_size(self.optimizer)
        super().on_reset()

    def sync(self) -> None:
        if self.optimizer is not None:
            _forget_pending_reductions(self.optimizer)
            _match_hooks_to_size(self.optimizer)
        if size() > 1:
            if self.model is not None:
                broadcast_parameters(self.model.state_dict(), root_rank=0)
            if self.optimizer is not None:
                broadcast_optimizer_state(self.optimizer, root_rank=0)
            for name, sampler in self._samplers.items():
                # commits are collective, so rank 0's progress is every rank's
                sampler.load_state_dict(
                    broadcast_object(sampler.state_dict(), 0, name=f"elastic.sampler.{name}")
                )
        else:
            for sampler in self._samplers.values():
                sampler.reset()
        super().sync()


def _copy_into(saved: Any, value: Any) -> Any:
    """A deep copy of ``value`` that reuses the tensors of ``saved`` (an earlier copy of
    the same structure) where shape and dtype still match."""
    if isinstance(value, torch.Tensor):
        if (
            isinstance(saved, torch.Tensor)
            and saved.shape == value.shape
            and saved.dtype == value.dtype
            and saved.device == value.device
        ):
            return saved.copy_(value.detach())
        return value.detach().clone()
    if isinstance(value, dict):
        old = saved if isinstance(saved, dict) else {}
        return {k: _copy_into(old.get(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        old = saved if isinstance(saved, (list, tuple)) and len(saved) == len(value) else ()
        items = [_copy_into(old[i] if old else None, v) for i, v in enumerate(value)]
        return items if isinstance(value, list) else type(value)(items)
    return copy.deepcopy(value)


def _match_hooks_to_size(optimizer: Any) -> None:
    """A DistributedOptimizer reduces gradients from backward hooks only when it was
    built with more than one rank; a job that shrank to one rank (or grew from one) must
    drop (or add) them, or its bookkeeping no longer matches what ``step()`` expects."""
    hooks = getattr(optimizer, "_hook_handles", None)
    register = getattr(optimizer, "_register_hooks", None)
    if not isinstance(hooks, list) or register is None:
        return
    if size() == 1 and hooks:
        for hook in hooks:
            hook.remove()
        hooks.clear()
    elif size() > 1 and not hooks:
        register()


def _forget_pending_reductions(optimizer: Any) -> None:
    """A failed step leaves handles of the dead runtime in a DistributedOptimizer."""
    handles = getattr(optimizer, "_handles", None)
    if isinstance(handles, dict):
        handles.clear()
    delay = getattr(optimizer, "_allreduce_delay", None)
    passes = getattr(optimizer, "backward_passes_per_step", 1)
    if isinstance(delay, dict):
        for p in delay:
            delay[p] = passes
    buckets = getattr(optimizer, "_buckets", None)
    if buckets is not None and hasattr(buckets, "reset"):
        buckets.reset()
    if hasattr(optimizer, "_synchronized"):
        optimizer._synchronized = False
    for group in getattr(optimizer, "param_groups", []):
        for p in group["params"]:
            p.grad = None
