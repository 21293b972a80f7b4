"""Gradient buckets: several gradients reduced as one flat tensor.

Each allreduce costs Python work four times over: in the gradient hook, in the queue, in
negotiation and in completion. In a backward pass on busy cores that was about 15 µs per
gradient in the hook alone (a 198-tensor transformer, 2 ranks on 2 cores), plus the cycle
thread's share per op; PyTorch DDP's reducer pays its equivalent once per bucket, in C++.
A bucket makes the per-gradient cost a counter in the hook: when its last gradient is
ready, one ``torch.cat`` (C++) builds the flat tensor, one op reduces it, and after the
wait one ``torch._foreach_copy_`` writes the results back. The results are bit-identical
to one reduction per gradient: every element meets the same op, scale factors and ranks.

Two layouts, both the same on every rank because they depend only on the parameters'
order, sizes and dtypes:

* **by size** (``HVDPROF_BUCKET_BYTES``): parameters in reverse registration order (the
  order backward produces their gradients, as DDP assumes before its first step), a new
  bucket once one holds the cap or the dtype or device changes. A gradient at least as
  large as the cap is a bucket of its own and keeps its own name and in-place reduction.
  So is the first gradient backward produces: its submission marks, on every rank, when
  backward reached its first gradient, which is what ``hvdprof analyze`` reads to tell a
  slow forward pass from a slow backward one (a bucket is submitted at its last
  gradient); it also starts the reductions early, as DDP's small first bucket does.
* **Horovod's ``groups``**: an integer splits the parameters, in registration order, into
  that many contiguous groups of near-equal count; a list of lists gives the groups.

A bucket of one parameter is reduced as that parameter alone (its own name, in place).

**The bucket's own buffer** (:func:`into_buffer`, PyTorch DDP's ``gradient_as_bucket_view``):
a bucket of dense, contiguous parameters of one dtype keeps one flat tensor for good, and
from its first submission on each ``p.grad`` is a view of it. The reduction is then in
place, so nothing is copied back after the wait: on the 198-tensor transformer that copy
was 0.9-2.6 ms of every ``step()``. Where the gradients already are those views
(``zero_grad(set_to_none=False)``, or accumulation over several backward passes) nothing
is copied in either; after ``zero_grad()`` (``set_to_none``) autograd hands over new
tensors, which are copied in once, as the flattening did. The one visible difference: a
reference to ``p.grad`` kept across steps sees the next step's gradients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


@dataclass(eq=False, slots=True)
class Bucket:
    """One bucket's members and this step's state (identity-hashed: a dict key)."""

    index: int
    params: tuple[torch.Tensor, ...]
    name: str
    ready: int = 0
    #: (handle, compression context, the parameters whose gradients the flat tensor holds,
    #: the bucket's own buffer when their gradients are its views, else None)
    in_flight: tuple[Any, Any, tuple[torch.Tensor, ...], torch.Tensor | None] | None = None
    submitted: bool = False
    #: the bucket's own flat buffer and each parameter's view of it (see
    #: :func:`into_buffer`); ``views`` stays empty where the bucket cannot have them
    flat: torch.Tensor | None = None
    views: tuple[torch.Tensor, ...] = ()
    #: False once found unable (mixed dtypes or devices, a parameter not contiguous)
    viewable: bool = True

    def reset(self) -> None:
        self.ready = 0
        self.in_flight = None
        self.submitted = False


@dataclass(slots=True)
class BucketPlan:
    """The buckets of one optimizer and, per parameter, the bucket it belongs to."""

    buckets: list[Bucket] = field(default_factory=list)
    of: dict[torch.Tensor, Bucket] = field(default_factory=dict)

    def reset(self) -> None:
        for bucket in self.buckets:
            bucket.reset()

    def pending(self) -> bool:
        """True while some bucket holds a ready gradient or an op in flight."""
        return any(b.ready or b.submitted for b in self.buckets)


def _split_by_kind(params: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Runs of consecutive parameters of one dtype and device (one flat tensor each)."""
    runs: list[list[torch.Tensor]] = []
    for p in params:
        if runs and runs[-1][-1].dtype == p.dtype and runs[-1][-1].device == p.device:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def by_size(params: Sequence[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Reverse registration order, closed at ``cap_bytes`` or a change of dtype/device;
    the first gradient backward produces alone (see the module doc)."""
    if not params:
        return []
    out: list[list[torch.Tensor]] = [[params[-1]]]
    size = cap_bytes  # the first bucket is closed
    for p in reversed(params[:-1]):
        last = out[-1][-1] if out else None
        if last is None or size >= cap_bytes or last.dtype != p.dtype or last.device != p.device:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel() * p.element_size()
    return out


def horovod_groups(params: Sequence[torch.Tensor], groups: Any) -> list[list[torch.Tensor]]:
    """Horovod's ``groups``: ``n`` contiguous groups of near-equal count (the first
    ``len % n`` one longer), or the given lists; a parameter in no list is reduced alone.
    Each group is split further where its dtype or device changes."""
    if isinstance(groups, int) and not isinstance(groups, bool):
        n = min(groups, len(params))
        if n <= 0:
            return []
        base, extra = divmod(len(params), n)
        out, start = [], 0
        for i in range(n):
            end = start + base + (1 if i < extra else 0)
            out.append(list(params[start:end]))
            start = end
    else:
        wanted = {id(p) for p in params}
        out = []
        for group in groups:
            members = [p for p in group if id(p) in wanted]
            if members:
                out.append(members)
    return [run for group in out for run in _split_by_kind(group)]


def check_groups(groups: Any) -> None:
    """Horovod's check: a non-negative integer, or a list of lists of tensors."""
    if groups is None:
        return
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(
                "groups should be a non-negative integer or a list of lists of tensors"
            )
        return
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and all(isinstance(t, torch.Tensor) for t in g) for g in groups
    ):
        raise ValueError("groups should be a non-negative integer or a list of lists of tensors")
    seen: set[int] = set()
    for group in groups:
        for t in group:
            if id(t) in seen:
                raise ValueError("groups: a parameter appears in more than one group")
            seen.add(id(t))


def plan(
    params: Sequence[torch.Tensor],
    names: Mapping[torch.Tensor, str],
    groups: Any,
    cap_bytes: int,
) -> BucketPlan:
    """The optimizer's buckets: Horovod's ``groups`` when given, else by size (``cap_bytes``
    0: none, one reduction per gradient as Horovod does by default)."""
    if groups:
        layout = horovod_groups(params, groups)
    elif cap_bytes > 0:
        layout = by_size(params, cap_bytes)
    else:
        layout = []
    out = BucketPlan()
    for members in layout:
        if len(members) < 2:
            continue  # reduced alone, as without buckets
        first = names[members[0]]
        bucket = Bucket(
            len(out.buckets),
            tuple(members),
            f"allreduce.bucket{len(out.buckets)}.{first}+{len(members) - 1}",
        )
        out.buckets.append(bucket)
        for p in members:
            out.of[p] = bucket
    return out


def flatten(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous copy of the gradients, end to end, built in C++ (the flattening DDP's
    comm hooks and apex use): a Python ``reshape`` per gradient cost about twice as much on
    the 198-tensor transformer."""
    return _flatten_dense_tensors(list(grads))


def unflatten_into(flat: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Write the reduced flat tensor back into each gradient: the shaped views are made in
    C++ and copied in one ``_foreach_copy_``. A Python ``view(shape)`` per gradient took
    1.6 of its 2.7 ms on the 198-tensor transformer, all of it in ``step()``'s wait."""
    grads = list(grads)
    torch._foreach_copy_(grads, _unflatten_dense_tensors(flat, grads))


def into_buffer(bucket: Bucket, params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The bucket's own flat buffer, holding the gradients of ``params`` (all of the
    bucket's, dense), each ``p.grad`` now its view there; None where the bucket cannot
    keep one (its gradients then go through :func:`flatten` and :func:`unflatten_into`).

    Gradients that are the views already (accumulated in place) are not copied; the
    others are copied in with one ``_foreach_copy_`` and their parameters pointed at the
    views. The buffer is made at the first call (again should the gradients' dtype or
    device change)."""
    if not bucket.viewable:
        return None
    grads = [p.grad for p in params]
    views = bucket.views
    first = grads[0]
    if not views or views[0].dtype != first.dtype or views[0].device != first.device:
        if any(
            g.dtype != first.dtype or g.device != first.device or not p.is_contiguous()
            for p, g in zip(params, grads, strict=True)
        ):
            bucket.viewable = False
            return None
        sizes = [p.numel() for p in params]
        flat = torch.empty(sum(sizes), dtype=first.dtype, device=first.device)
        views = tuple(piece.view_as(p) for piece, p in zip(flat.split(sizes), params, strict=True))
        bucket.flat, bucket.views = flat, views
    stale = [i for i, (g, v) in enumerate(zip(grads, views, strict=True)) if g is not v]
    if len(stale) == len(views):
        torch._foreach_copy_(list(views), grads)
    elif stale:
        torch._foreach_copy_([views[i] for i in stale], [grads[i] for i in stale])
    for i in stale:
        params[i].grad = views[i]
    return bucket.flat
