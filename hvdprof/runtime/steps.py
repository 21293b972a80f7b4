"""The runtime's own notion of a training step, so tuning and sampling need no user hook."""

from __future__ import annotations

from typing import Any

#: the mark of a name the runtime gave an unnamed op (``runtime.NameAllocator``)
_UNNAMED = ".noname."


class StepCounter:
    """A step ends when a tensor name completes a second time.

    Training submits the same gradient names once per step, so the first repeat marks
    the boundary. Completion order is identical on every rank, so is the count.

    Once a named op has completed, the names the runtime gives unnamed ops no longer mark
    steps: those names are recycled slots (``allreduce.noname.0`` for every blocking
    unnamed call), so ``hvd.SyncBatchNorm``'s statistics, reduced unnamed in every layer's
    forward and backward, made about ten "steps" of one training step in Horovod's
    synthetic benchmark, and the autotuner's windows of three steps were a fraction of a
    batch. A job whose ops are all unnamed still counts their repeats (it has nothing
    else).
    """

    __slots__ = ("_last_ops", "_named", "_repeats", "_seen", "step")

    def __init__(self) -> None:
        self.step = 0
        self._seen: set[str] = set()
        self._named = False  # a named op has completed: unnamed ones mark no steps
        #: the last batch :meth:`completed_ops` took, and whether it ended a step in a way
        #: that the same batch again ends one more and leaves everything as it is
        self._last_ops: list[Any] = []
        self._repeats = False

    def completed_ops(self, ops: list[Any]) -> None:
        """``completed_many`` of the ops' names (objects with a ``name``).

        A cached step completes the very same op objects as the step before (the response
        cache's entries), thousands of them: a batch identical to the last, which ended a
        step at its first repeat, ends one more and changes nothing else. That costs one
        comparison of two lists by identity instead of a pass over every name.
        """
        if self._repeats and ops == self._last_ops:
            self.step += 1
            return
        self._repeats = self._completed_many([op.name for op in ops])
        self._last_ops = ops

    def completed_many(self, names: list[str]) -> None:
        """The same as ``completed`` for each name, at C speed when no step ends."""
        self._completed_many(names)
        self._repeats = False  # (a batch by name: completed_ops compares no names)

    def _completed_many(self, names: list[str]) -> bool:
        """``completed_many``; True when the batch ended a step at its first repeat with
        every name named and none twice: the same batch again would end exactly one more
        and leave the names seen as they are."""
        seen = self._seen
        distinct = len(set(names)) == len(names)
        if distinct and seen.isdisjoint(names):
            seen.update(names)
            if not self._named:
                self._named = any(_UNNAMED not in name for name in names)
            return False
        if distinct and _UNNAMED not in "\n".join(names):
            # Every name named, none twice in the batch (a step's worth of gradients, the
            # common case): only the first already seen ends a step; from there on, the
            # batch's names are the new step's first. Per-name calls cost ~0.5 us each.
            first = next(i for i, name in enumerate(names) if name in seen)
            self.step += 1
            seen.clear()
            seen.update(names[first:] if first else names)
            self._named = True
            return True
        for name in names:  # ``completed`` for each: repeats within the batch, or unnamed
            self.completed(name)
        return False

    def completed(self, name: str) -> None:
        self._repeats = False
        unnamed = _UNNAMED in name
        if name in self._seen and not (unnamed and self._named):
            self.step += 1
            self._seen.clear()
        self._seen.add(name)
        self._named = self._named or not unnamed
