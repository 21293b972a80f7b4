"""``DistributedOptimizer``: allreduce gradients as backward produces them.

Hooks fire per parameter once its gradient is accumulated, so communication of the
last layers' gradients overlaps computation of the first layers'. Gradients go out in
buckets (``buckets``): one flat op once a bucket's last gradient is ready. With ``op=Adasum``
(and more than one rank) it is Horovod's delta optimizer instead: each rank steps its
own optimizer on its own gradient, and the parameter updates are combined with Adasum.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from hvdprof.runtime import runtime as _rt
from hvdprof.runtime.adasum import AdasumUnsupportedError, is_power_of_two
from hvdprof.torch import buckets as _buckets
from hvdprof.torch.compression import Compression
from hvdprof.torch.divergence import DivergenceCheck
from hvdprof.torch.mpi_ops import (
    Adasum,
    Average,
    allgather,
    allreduce_async_,
    rank,
    size,
    synchronize,
)
from hvdprof.torch.process_sets import global_process_set, set_of
from hvdprof.torch.sparse import sparse_allreduce_async


def _named_parameters(param_groups: list[dict[str, Any]], named_parameters: Any) -> list[Any]:
    """(name, parameter) pairs, checked as Horovod checks them; generated names without."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [
            (f"allreduce.noname.{i}.{j}", v)
            for i, group in enumerate(param_groups)
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
    all_ids = {id(v) for group in param_groups for v in group["params"]}
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = all_ids - named_ids
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters were not "
            f"named. Python object ids: {', '.join(str(i) for i in sorted(unnamed))}"
        )
    return named_parameters


def _divergence_check(named_parameters: list[Any]) -> DivergenceCheck | None:
    """The HVDPROF_CHECK_DIVERGENCE check for this optimizer, or None when off (or 1 rank)."""
    runtime = _rt.get()
    every = runtime.config.check_divergence
    if every <= 0 or runtime.size <= 1:
        return None
    named = sorted(named_parameters, key=lambda kv: kv[0])  # the same order on every rank
    return DivergenceCheck(
        every,
        named,
        lambda t: allgather(t, name="hvdprof.divergence_check"),
        runtime.rank,
    )


def _timeline_sink() -> Any:
    return getattr(getattr(_rt.get(), "timeline", None), "sink", None)


def _guard_accumulation(optimizer: Any, p: torch.Tensor) -> None:
    """Raise the too-many-backward-passes error *before* autograd accumulates into
    ``p.grad``.

    ``p.grad`` is the buffer the in-place allreduce started by the previous backward pass
    reduces. A post-accumulate hook raises only after autograd has added the new gradient
    into that buffer while the reduction may be reading or writing it: a read-modify-write
    race that left each rank stepping with its own unaveraged gradient (ranks diverged
    silently under mpirun). A pre-hook on the parameter's AccumulateGrad node runs before
    the addition, so a misuse error leaves the gradients as they were. The node is kept
    alive here: autograd holds it weakly and a new one (without the hook) would replace it.
    """
    node = torch.autograd.graph.get_gradient_edge(p).node

    def before_accumulation(grad_outputs: Any) -> None:
        optimizer._check_not_overdue(p)

    node.register_prehook(before_accumulation)
    optimizer._grad_accs.append(node)


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
        process_set: Any = global_process_set,
    ) -> None:
        super(self.__class__, self).__init__(params)
        self._process_set = process_set
        _, members = set_of(process_set, "DistributedOptimizer", outside_ok=True)
        self._ranks = size() if members is None else len(members)
        # as Horovod's: a rank outside the optimizer's set steps on its own gradients
        self._included = members is None or rank() in members
        self._compression = compression
        named_parameters = _named_parameters(self.param_groups, named_parameters)
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
        self._sparse_as_dense = sparse_as_dense
        self.gradient_predivide_factor = gradient_predivide_factor
        self._handles: dict[torch.Tensor, tuple[int | None, Any]] = {}
        self._hook_handles: list[Any] = []
        self._grad_accs: list[Any] = []
        self._synchronized = False
        self._should_synchronize = True
        self._divergence = _divergence_check(named_parameters)
        _buckets.check_groups(groups)
        self._groups = groups
        self._buckets = _buckets.BucketPlan()
        if self._ranks > 1 and self._included:
            self._register_hooks()

    def _register_hooks(self) -> None:
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._buckets = _buckets.plan(
            params, self._parameter_names, self._groups, _rt.get().config.bucket_bytes
        )
        for p in params:
            _guard_accumulation(self, p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def _check_not_overdue(self, p: torch.Tensor) -> None:
        if self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally."
            )

    def _scales(self) -> tuple[float, float]:
        """(prescale, postscale): Average splits ``gradient_predivide_factor`` between them."""
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self._sparse_as_dense:
                # indices and values allgathered, as Horovod does: synchronize() calls it
                handle = sparse_allreduce_async(
                    tensor, name=f"allreduce.{name}", op=self.op, process_set=self._process_set
                )
                return handle, None
            tensor = tensor.to_dense()  # reduced densely; synchronize() replaces p.grad
        elif not tensor.is_contiguous():
            # a channels_last conv weight's gradient: reduced in a contiguous copy, and
            # synchronize() copies the result back (an in-place allreduce needs contiguous)
            tensor = tensor.contiguous()
        prescale, postscale = self._scales()
        compressed, ctx = self._compression.compress(tensor)
        handle = allreduce_async_(
            compressed,
            name=f"allreduce.{name}",
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self._process_set,
        )
        return handle, (ctx, compressed)

    def _hook(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        self._check_not_overdue(p)  # normally raised already, before accumulation
        self._allreduce_delay[p] -= 1
        bucket = self._buckets.of.get(p)
        if bucket is None:
            handle, ctx = None, None
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        elif self._allreduce_delay[p] == 0:
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                self._submit_bucket(bucket)

    def _submit_bucket(self, bucket: _buckets.Bucket) -> None:
        """Reduce the bucket's gradients as one flat tensor (a sparse one on its own)."""
        bucket.submitted = True
        dense = []
        for p in bucket.params:
            if p.grad.is_sparse:
                self._handles[p] = self._allreduce_grad_async(p)
            else:
                dense.append(p)
        if len(dense) == 1:
            self._handles[dense[0]] = self._allreduce_grad_async(dense[0])
        if len(dense) < 2:
            return
        prescale, postscale = self._scales()
        own = _buckets.into_buffer(bucket, dense) if len(dense) == len(bucket.params) else None
        flat = own if own is not None else _buckets.flatten([p.grad for p in dense])
        compressed, ctx = self._compression.compress(flat)
        handle = allreduce_async_(
            compressed,
            name=bucket.name,
            op=self.op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=self._process_set,
        )
        bucket.in_flight = (handle, ctx, tuple(dense), own)

    def synchronize(self) -> None:
        """Wait for every gradient allreduce; gradients are averaged when this returns."""
        if self._ranks == 1 or not self._included:
            self._synchronized = True
            return
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad or p in self._handles or p in self._buckets.of:
                    continue
                # never produced a gradient this step (unused parameter): reduce zeros so
                # every rank submits the same names
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                self._allreduce_delay[p] = 1
                self._handles[p] = self._allreduce_grad_async(p)
                self._allreduce_delay[p] = 0
        for bucket in self._buckets.buckets:
            if not bucket.submitted:
                # an unused parameter, or fewer backward passes than
                # backward_passes_per_step: zeros for a missing gradient, reduce now
                for p in bucket.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                self._submit_bucket(bucket)
        for bucket in self._buckets.buckets:
            if bucket.in_flight is not None:
                handle, ctx, dense, own = bucket.in_flight
                reduced = self._compression.decompress(synchronize(handle), ctx)
                if own is None:
                    _buckets.unflatten_into(reduced, [p.grad for p in dense])
                elif reduced is not own:  # (compressed: reduced in another tensor)
                    own.copy_(reduced)
            for p in bucket.params:
                self._allreduce_delay[p] = self.backward_passes_per_step
            bucket.reset()
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                # fewer backward passes than backward_passes_per_step: reduce now
                handle, ctx = self._allreduce_grad_async(p)
            output = synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if ctx is None:  # a sparse gradient, reduced sparse
                p.grad = output
                continue
            dtype_ctx, _ = ctx
            reduced = self._compression.decompress(output, dtype_ctx)
            if p.grad.is_sparse:  # sparse_as_dense: reduced densely, sparse again (as
                p.grad = reduced.to_sparse()  # Horovod's): SparseAdam still gets sparse
            elif reduced is not p.grad:
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
        if self._divergence is not None and self._divergence.due():
            self._divergence.check(_timeline_sink())
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles or self._buckets.pending():
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        return super(self.__class__, self).zero_grad(set_to_none)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Horovod's delta optimizer for ``op=Adasum``: when a parameter's gradient is ready,
    this rank steps the wrapped optimizer on that parameter alone, and the change it made
    (the delta) is allreduced with Adasum; ``step()`` applies the combined delta to the
    parameter as it was before the local step."""

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: Any,
        backward_passes_per_step: int,
    ) -> None:
        super(self.__class__, self).__init__(params)
        self._compression = compression
        named_parameters = _named_parameters(self.param_groups, named_parameters)
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1")
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in named_parameters}
        self._handles: dict[torch.Tensor, tuple[int | None, Any]] = {}
        self._starting_models = {
            p: torch.zeros_like(p, requires_grad=False) for _, p in named_parameters
        }
        self._requires_update: list[torch.Tensor] = []
        self._hook_handles: list[Any] = []
        self._grad_accs: list[Any] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._requires_update.append(p)
                    _guard_accumulation(self, p)
                    self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def _check_not_overdue(self, p: torch.Tensor) -> None:
        if self._handles.get(p, (None,))[0] is not None and self._allreduce_delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call "
                "to step(). Increase backward_passes_per_step to accumulate gradients locally."
            )

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _allreduce_grad_async(self, p: torch.Tensor) -> tuple[int, Any]:
        """Step the wrapped optimizer on ``p`` alone; start an Adasum of the change."""
        start = self._starting_models[p]
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is v for v in group["params"]) else []
        try:
            start.copy_(p.detach())
            super(self.__class__, self).step()
        finally:
            for group, kept in zip(self.param_groups, stashed, strict=True):
                group["params"] = kept
        with torch.no_grad():
            p.sub_(start)  # p now holds this rank's delta
        compressed, ctx = self._compression.compress(p.detach())
        handle = allreduce_async_(
            compressed, name=f"allreduce.{self._parameter_names.get(p)}", op=Adasum
        )
        return handle, (ctx, compressed)

    def _hook(self, p: torch.Tensor) -> None:
        self._check_not_overdue(p)
        handle, ctx = None, None
        self._allreduce_delay[p] -= 1
        if self._allreduce_delay[p] == 0:
            handle, ctx = self._allreduce_grad_async(p)
        self._handles[p] = (handle, ctx)

    def synchronize(self) -> None:
        """Nothing to wait for before ``step()``: the deltas are applied there."""

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        raise AssertionError(
            "Skipping synchronization is not supported when using Adasum optimizer."
        )
        yield  # pragma: no cover (a generator, for contextmanager)

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if p not in self._handles:
                self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:  # fewer backward passes than backward_passes_per_step
                handle, ctx = self._allreduce_grad_async(p)
            delta = self._compression.decompress(synchronize(handle), ctx[0])
            start = self._starting_models[p]
            start.add_(delta.to(start.dtype))
            with torch.no_grad():
                p.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

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
    ``isinstance`` checks and LR schedulers keep working. ``op=Adasum`` on more than one
    rank gives Horovod's delta optimizer (see ``_DistributedAdasumOptimizer``).

    Gradients are reduced in buckets of about ``HVDPROF_BUCKET_BYTES`` (one flat tensor
    each, ``hvdprof.torch.buckets``); ``groups`` (an integer, or lists of parameters) gives
    Horovod's explicit groups instead, each reduced once all its gradients are ready.
    """
    if process_set is not global_process_set:
        set_of(process_set, "DistributedOptimizer", outside_ok=True)
    if num_groups:
        warnings.warn(
            "DistributedOptimizer: num_groups is replaced by groups (as in Horovod)",
            DeprecationWarning,
            stacklevel=2,
        )
        if groups is None:
            groups = num_groups
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and size() > 1:
        members = set_of(process_set, "DistributedOptimizer", outside_ok=True)[1]
        if members is not None and len(members) != size():
            raise ValueError("DistributedOptimizer(op=Adasum) supports the global process set only")
        if not is_power_of_two(size()):
            raise AdasumUnsupportedError(
                f"DistributedOptimizer(op=Adasum) needs a power-of-two number of ranks (as "
                f"Horovod's), this job has {size()}"
            )
        adasum_cls = type(
            optimizer.__class__.__name__,
            (optimizer.__class__,),
            dict(_DistributedAdasumOptimizer.__dict__),
        )
        return adasum_cls(
            optimizer.param_groups, named_parameters, compression, backward_passes_per_step
        )
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
        process_set,
    )
