"""The consumer queue's wake-up file descriptor: librdkafka signals trio's thread itself.

Owns the one reach into confluent-kafka's private layout: a `Consumer`'s `rd_kafka_t *` is the first
field after the object header of its C `Handle` (`src/confluent_kafka/src/confluent_kafka.h`), read only
for a version and object size checked here (`CHECKED_WITH`), then checked through librdkafka
(`rd_kafka_type` is a consumer, `rd_kafka_name` starts with the `client.id`). `queue_signal` enables
`rd_kafka_queue_io_event_enable` on the consumer queue (the main queue is forwarded into it): a byte on a
pipe whenever it goes from empty to not empty. A failed check gives its reason instead (the source then
polls on a thread of its own). Through `ctypes`, on the librdkafka the wheel ships.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

from sidecar.config.librdkafka import library_path

# The confluent-kafka versions whose `Handle` layout was read (the `rd_kafka_t *` right after
# PyObject_HEAD), with `Consumer.__basicsize__` there: a version not listed, or another size, is not
# used (`tests/unit/test_queue_signal.py` fails on a new pin until it is read and added).
CHECKED_WITH: dict[str, int] = {"2.16.1": 176}
_RD_KAFKA_CONSUMER = 1  # rd_kafka_type_t
_PAYLOAD = b"\x01"


@dataclass(slots=True)
class QueueSignal:
    """A consumer queue's wake-up: `fd` becomes readable when records or events are waiting.

    `clear()` empties the pipe before the queue is drained; `close()` disables the signal and
    releases the queue (before the consumer is closed) and the pipe."""

    fd: int
    _write_fd: int
    _queue: int
    _lib: _Library = field(repr=False)
    _closed: bool = False

    def clear(self) -> None:
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lib.rd_kafka_queue_io_event_enable(self._queue, -1, None, 0)
        self._lib.rd_kafka_queue_destroy(self._queue)
        os.close(self.fd)
        os.close(self._write_fd)


def queue_signal(consumer: confluent_kafka.Consumer, client_id: str) -> QueueSignal | str:
    """The consumer queue's wake-up for `consumer`, or why it cannot be had (one line)."""
    version = installed_version()
    size = CHECKED_WITH.get(version)
    if size is None:
        return f"confluent-kafka {version} is not one the handle layout was checked with"
    if type(consumer).__basicsize__ != size:
        return f"confluent-kafka's Consumer is {type(consumer).__basicsize__} bytes, not {size}"
    lib = _library()
    if lib is None:
        return "the librdkafka of confluent-kafka's wheel could not be loaded"
    rk = handle_pointer(consumer)
    if not rk:
        return "the consumer has no librdkafka handle (closed)"
    if lib.rd_kafka_type(rk) != _RD_KAFKA_CONSUMER:
        return "the handle read is not a librdkafka consumer"
    name = (lib.rd_kafka_name(rk) or b"").decode(errors="replace")
    if not name.startswith(f"{client_id}#consumer-"):
        return f"the handle read is named {name!r}, not after client.id {client_id!r}"
    queue = lib.rd_kafka_queue_get_consumer(rk)
    if not queue:
        return "librdkafka gave no consumer queue"
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    lib.rd_kafka_queue_io_event_enable(queue, write_fd, _PAYLOAD, len(_PAYLOAD))
    return QueueSignal(read_fd, write_fd, queue, lib)


def installed_version() -> str:
    """The confluent-kafka distribution's version (what the pin names)."""
    return importlib.metadata.version("confluent-kafka")


def handle_pointer(consumer: confluent_kafka.Consumer) -> int:
    """The `rd_kafka_t *` of `consumer` (0 once closed): only for a layout in `CHECKED_WITH`."""
    return ctypes.c_void_p.from_address(id(consumer) + object.__basicsize__).value or 0


@dataclass(frozen=True, slots=True)
class _Library:
    """The librdkafka functions used here, typed (ctypes prototypes bound to the library)."""

    rd_kafka_type: Callable[[int], int]
    rd_kafka_name: Callable[[int], bytes | None]
    rd_kafka_queue_get_consumer: Callable[[int], int | None]
    rd_kafka_queue_destroy: Callable[[int], None]
    rd_kafka_queue_io_event_enable: Callable[[int, int, bytes | None, int], None]


@functools.cache
def _library() -> _Library | None:
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    ptr, c_int, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t

    def fn(name: str, restype: Any, *argtypes: Any) -> Any:
        return ctypes.CFUNCTYPE(restype, *argtypes)((name, lib))

    return _Library(
        fn("rd_kafka_type", c_int, ptr),
        fn("rd_kafka_name", ctypes.c_char_p, ptr),
        fn("rd_kafka_queue_get_consumer", ptr, ptr),
        fn("rd_kafka_queue_destroy", None, ptr),
        fn("rd_kafka_queue_io_event_enable", None, ptr, c_int, ctypes.c_char_p, size),
    )


__all__ = ["CHECKED_WITH", "QueueSignal", "handle_pointer", "installed_version", "queue_signal"]
