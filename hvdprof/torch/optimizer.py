"""``DistributedOptimizer``: allreduce gradients as backward produces them.

Hooks fire per parameter once its gradient is accumulated, so communication of the
last layers' gradients overlaps computation of the first layers'.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from hvdprof.torch.compression import Compression
from hvdprof.torch.mpi_ops import (
    Adasum,
    Average,
    allreduce_async_,
    global_process_set,
    size,
    synchronize,
)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: Any,
        backward_passes_per_step: int,
        op: int,
        gradient_predivide_factor: float,
        groups: Any,
        sparse_as_dense: bool,
    ) -> None:
        super(self.__class__, self).__init__(params)
        self._compression = compression
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [
                (f"allreduce.noname.{i}.{j}", v)
                for i, group in enumerate(self.param_groups)
                for j, v in enumerate(group["params"])
            ]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError(
                "named_parameters should be a sequence of tuples (name, parameter), usually "
                "produced by model.named_parameters()."
            )
        names = [k for k, _ in named_parameters]
        duplicates = sorted({k for k in names if names.count(k) > 1})
        if duplicates:
            raise ValueError(
                "Parameter names in named_parameters must be unique. Found duplicates: "
                + ", ".join(duplicates)
            )
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = all_ids - named_ids
        if unnamed:
            raise ValueError(
                "named_parameters was specified, but one or more model parameters were not "
                f"named. Python object ids: {', '.join(str(i) for i in sorted(unnamed))}"
            )
        if op == Adasum:
            raise NotImplementedError("Adasum is not supported by hvdprof")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {
            v: backward_passes_per_step for _, v in sorted(named_parameters, key=lambda x: x[0])
        }
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self._handles: dict[torch.Tensor, tuple[int | None, Any]] = {}
        self._hook_handles: list[Any] = []
        self._synchronized = False
        self._should_synchronize = True
        if size() > 1:
            self._register_hooks()

    def _register_hooks(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[int, Any]:
        name = self._parameter_names.get(p)
        tensor = p.grad
        prescale, postscale = 1.0, 1.0
        if self.op == Average:
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        compressed, ctx = self._compression.compress(tensor)
        handle = allreduce_async_(
            compressed,
            name=f"allreduce.{name}",
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
        )
        return handle, (ctx, compressed)

    def _hook(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally."
            )
        handle, ctx = None, None
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            handle, ctx = self._allreduce_grad_async(p)
        self._handles[p] = (handle, ctx)

    def synchronize(self) -> None:
        """Wait for every gradient allreduce; gradients are averaged when this returns."""
        if size() == 1:
            self._synchronized = True
            return
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad or p in self._handles:
                    continue
                # never produced a gradient this step (unused parameter): reduce zeros so
                # every rank submits the same names
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._allreduce_delay[p] = 1
                self._handles[p] = self._allreduce_grad_async(p)
                self._allreduce_delay[p] = 0
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                # fewer backward passes than backward_passes_per_step: reduce now
                handle, ctx = self._allreduce_grad_async(p)
            output = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            dtype_ctx, _ = ctx
            reduced = self._compression.decompress(output, dtype_ctx)
            if reduced is not p.grad:
                p.grad.copy_(reduced)
        self._handles.clear()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Use after a manual ``synchronize()`` (e.g. to clip gradients) so step() won't wait again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to "
                    "consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        return super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged over all ranks.

    Returns an instance of a subclass of the optimizer's own class, as Horovod does, so
    ``isinstance`` checks and LR schedulers keep working.
    """
    cls = type(
        optimizer.__class__.__name__,
        (optimizer.__class__,),
        dict(_DistributedOptimizer.__dict__),
    )
    return cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
    )
