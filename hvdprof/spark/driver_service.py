"""The driver's end of a Spark job: where its tasks register and report, one thread each.

Horovod's Spark driver runs a service its tasks register with before any rank starts;
so does this one, over ``multiprocessing.connection`` (its HMAC handshake keeps anyone
without the job's random key out). Every connection gets a reader thread that turns what
the task says into events on one queue, which the driver's main thread consumes; a
connection that closes before its task reported an ``Outcome`` is a dead task.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import socket
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener

from hvdprof.spark.messages import Assignment, Outcome, Register


@dataclass(frozen=True)
class TaskEvent:
    """Something task ``partition`` said (``message``), or its connection closing (None)."""

    partition: int
    message: object | None


class DriverService:
    """Accepts the job's tasks; ``events`` yields what they say, in arrival order."""

    def __init__(self, advertised_host: str) -> None:
        self.authkey = secrets.token_bytes(32)
        self._listener = Listener(("0.0.0.0", 0), authkey=self.authkey)
        self.address = (advertised_host, int(self._listener.address[1]))
        self.events: queue.Queue[TaskEvent] = queue.Queue()
        self._conns: dict[int, Connection] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._acceptor = threading.Thread(
            target=self._accept, name="hvdprof-spark-accept", daemon=True
        )
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except Exception:  # a stranger without the key, or the listener closing
                if self._closed.is_set():
                    return
                continue
            threading.Thread(
                target=self._read, args=(conn,), name="hvdprof-spark-task", daemon=True
            ).start()

    def _read(self, conn: Connection) -> None:
        partition = -1
        reported = False
        try:
            first = conn.recv()
            if not isinstance(first, Register):
                conn.close()
                return
            partition = first.place.partition
            with self._lock:
                self._conns[partition] = conn
            self.events.put(TaskEvent(partition, first))
            while True:
                message = conn.recv()
                reported = reported or isinstance(message, Outcome)
                self.events.put(TaskEvent(partition, message))
        except (EOFError, OSError):
            pass
        except Exception:  # a message that does not unpickle here: the task is lost to us
            pass
        finally:
            if partition >= 0 and not reported and not self._closed.is_set():
                self.events.put(TaskEvent(partition, None))

    def assign(self, partition: int, assignment: Assignment) -> None:
        with self._lock:
            conn = self._conns[partition]
        conn.send(assignment)

    def close(self) -> None:
        """Stop accepting and drop every connection (a task still waiting ends at once)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):  # wake accept(): it then sees _closed
            socket.create_connection(("127.0.0.1", self.address[1]), timeout=2).close()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:  # shutdown wakes the reader blocked in recv(); close alone may not
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        self._acceptor.join(timeout=5)
