"""The node buffer and the published weights: the two objects a host's learners and its updater share.

SPRINT (Oyama et al., IEEE BigData 2016) has no parameter server: on each node the learners hand their
gradients to the node's updater through a mutex-protected buffer, and the updater publishes new weights
to the node's learners. Both objects live here.

`NodeBuffer`: every learner ADDS its result vector into one running sum under the mutex (``np.add`` with
``out=``, in place, no allocation), instead of queueing it for the updater to sum (a queue summed by the
updater fell behind at once, docs/sprint-model.md): summing in the learners keeps the updater's cycle T_u
short and independent of the number of gradients it gathers. The
updater's `NodeBuffer.swap` takes the sum, the count and the gradients' records (who, which version was
read, when) and leaves an empty buffer: every gradient that arrived since the previous swap is in exactly
one swap. A result vector is ``[gradient (P) | BatchNorm batch statistics (S) | loss | correct]`` in
float32 (see `jaxsprint.runtime.learner`), so one addition covers all of it.

`Published`: the newest version ``v`` and its weights (a flat float32 vector on the updater's device).
Learners read ``current`` without a lock (one tuple, replaced atomically under the GIL); the condition is
only for waiting (lockstep mode, evaluation).

Every wait here takes a timeout: a caller loops on it and checks the run's stop and error flags, so no
thread waits for ever on a thread that died.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, NamedTuple

import numpy as np


class GradientRecord(NamedTuple):
    """One gradient's bookkeeping (the event log's gradient row, without the applied version)."""

    learner: int        # global learner index: host * learners_per_host + local index
    host: int
    read_version: int   # version of the weights the learner read
    t_start: float      # read (start of the learner's cycle), seconds since the common start
    t_end: float        # added to the buffer (end of the cycle)


@dataclasses.dataclass
class Gathered:
    """What one swap took out of the buffer."""

    total: np.ndarray                 # float32 [width]: the sum of the result vectors
    count: int                        # gradients in it
    records: list[GradientRecord]     # in order of arrival


class NodeBuffer:
    """Mutex-protected running sum of the learners' result vectors (one node buffer per host).

    Args:
      width: length of a result vector.
    """

    def __init__(self, width: int):
        self._width = int(width)
        self._cond = threading.Condition(threading.Lock())
        self._total = np.zeros(self._width, np.float32)
        self._count = 0
        self._records: list[GradientRecord] = []
        self.added = 0  # gradients ever added (accounting: added = applied + in flight)

    @property
    def width(self) -> int:
        return self._width

    def add(self, vector: np.ndarray, record: GradientRecord) -> None:
        """Adds one learner's result vector (float32 [width]) and its record; wakes a waiting updater."""
        with self._cond:
            np.add(self._total, vector, out=self._total)
            self._count += 1
            self.added += 1
            self._records.append(record)
            self._cond.notify_all()

    def swap(self) -> Gathered:
        """Takes everything that arrived since the last swap and leaves the buffer empty."""
        fresh = np.zeros(self._width, np.float32)  # calloc'ed: cheap even for large P
        with self._cond:
            out = Gathered(self._total, self._count, self._records)
            self._total, self._count, self._records = fresh, 0, []
        return out

    def wait_count(self, n: int, timeout: float) -> bool:
        """Waits until at least `n` gradients are in the buffer or `timeout` seconds pass; whether they are."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count >= n, timeout)

    def count(self) -> int:
        with self._cond:
            return self._count


class Published:
    """The newest published version and its weights (and BatchNorm running statistics)."""

    def __init__(self, params: Any, batch_stats: np.ndarray):
        self._cond = threading.Condition(threading.Lock())
        # (version, flat params on the updater's device, flat running statistics as numpy)
        self.current: tuple[int, Any, np.ndarray] = (0, params, batch_stats)

    @property
    def version(self) -> int:
        return self.current[0]

    def publish(self, version: int, params: Any, batch_stats: np.ndarray) -> None:
        with self._cond:
            self.current = (version, params, batch_stats)
            self._cond.notify_all()

    def wait_newer(self, version: int, timeout: float) -> bool:
        """Waits until a version newer than `version` is published or `timeout` passes; whether it is."""
        with self._cond:
            return self._cond.wait_for(lambda: self.current[0] > version, timeout)

    def wake(self) -> None:
        """Wakes every waiter (at the stop) so that it rechecks the run's flags at once."""
        with self._cond:
            self._cond.notify_all()


class Control:
    """The run's stop flag and the first error any thread raised (then the run stops)."""

    def __init__(self):
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        """Records `error` (the first one wins) and asks every thread to stop."""
        with self._lock:
            if self._error is None:
                self._error = error
        self.stop.set()

    @property
    def error(self) -> BaseException | None:
        return self._error
