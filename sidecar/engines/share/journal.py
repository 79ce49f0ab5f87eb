"""The share engine's own account of deliveries (`share.journal.path`): what a death really charged.

Owns `ShareJournal`: a local append-only file, one line per event (its grammar, where it lives, the
lock that makes it one sidecar's, and why a write needs no fsync: its docstring). What cannot be read
degrades to the broker's counts, never to a loss.

Pure bookkeeping (no Kafka client): the share engine (`sidecar.engines.share.group`) calls it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import IO

from sidecar.config import JOURNAL_AUTO

log = logging.getLogger("sidecar.share")

Coord = tuple[str, int, int]

HELD = "a"  # acquired, no answer yet
ALONE = "s"  # sent to the app alone
ANSWERED = "k"  # accepted or rejected, the acknowledgement not confirmed by the broker yet
RELEASED = "r"  # released after an attempt that counts
UNSENT = "u"  # released without an attempt (not counted)
DEFERRED = "v"  # a suspect released without an attempt: still a suspect
DONE = "d"
DIED = "z"
_STATES = (ALONE, ANSWERED, RELEASED, UNSENT, DEFERRED, DONE, DIED)

_MAX_ENTRIES = 50_000  # the oldest are forgotten first (their records counted by the broker)
_COMPACT_LINES = 200_000  # rewrite the file (live entries only) past this many appended lines


def default_journal_path(group: str, env: Mapping[str, str]) -> str:
    """The journal's path for `share.journal.path: auto`: `dlq-sidecar/share-journal-<group>` under
    `$XDG_STATE_HOME` (ignored unless absolute, as the XDG spec says) or `~/.local/state`.

    A group id that is not a plain file name (characters other than letters, digits, `.`, `_`, `-`,
    or over 100 of them) is written with those replaced by `_` and a hash of the id appended, so two
    groups never share a file.
    """
    state = env.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        home = env.get("HOME") or os.path.expanduser("~")
        state = os.path.join(home, ".local", "state")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", group)[:100]
    name = f"share-journal-{safe}"
    if safe != group:
        name += "-" + hashlib.sha256(group.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return os.path.join(state, "dlq-sidecar", name)


def journal_path(setting: str | None, group: str, env: Mapping[str, str]) -> str | None:
    """Where `share.journal.path` puts the journal of group `group`: None for null (no journal)."""
    if setting == JOURNAL_AUTO:
        return default_journal_path(group, env)
    return setting


@dataclass(slots=True)
class Entry:
    broker: int  # the broker's delivery count at the last acquisition this journal saw
    count: int  # the sidecar's count for that acquisition
    state: str  # HELD, ALONE, ANSWERED, RELEASED, UNSENT or DEFERRED
    incarnation: int  # which incarnation (in this file) acquired it
    died: bool = False  # its incarnation died with it in `state`

    @property
    def suspect(self) -> bool:
        """Held without an answer when its incarnation died (maybe what killed it), or a suspect
        the isolation pass released unsent."""
        return self.state == DEFERRED or (self.died and self.state in (HELD, ALONE))


@dataclass(frozen=True, slots=True)
class Recovery:
    """What the last incarnation left when it died: its records still held, with their counts."""

    died: bool
    held: dict[Coord, Entry]  # held, alone or released unsent by the dead incarnation
    consumers: int  # the dead incarnation's share consumers (its death charged up to this many)
    # What the deaths since the last clean stop can have charged a record this journal never saw
    # (fetched by the dead process, never handed to the sidecar): one per consumer and death.
    allowance: int = 0


def counted(entry: Entry | None, broker: int) -> int:
    """The sidecar's count for an acquisition the broker numbers `broker`.

    No entry: the broker's count (as without a journal). Otherwise from the last acquisition the
    journal saw. After a death (the broker's count then holds its extra charges): alone at the app,
    or released after an attempt, one more; held, answered or released unsent, the same count again
    (not charged). Without a death between: released after an attempt one more, unsent the same, and
    acquisitions the journal did not see in between (another replica's) count too; one this
    incarnation still holds came back because its lock ran out: an attempt. Never above the
    broker's count, never below 1.
    """
    if entry is None:
        return max(1, broker)
    if entry.died:
        n = entry.count + (1 if entry.state in (ALONE, RELEASED) else 0)
    else:
        gap = max(0, broker - entry.broker - 1)
        n = entry.count + gap + (0 if entry.state in (UNSENT, DEFERRED) else 1)
    return max(1, min(broker, n))


class ShareJournal:
    """One group's journal file; `open` reads what the last incarnation left and starts a new one.

    A share group's broker counts every acquisition as a delivery, so a sidecar's death charges every
    record it held, and up to once more per share consumer of the dead process (docs/engines.md, "What a
    death charges"). This journal lets the next incarnation count as the consumer engine does: a
    delivery that ended in a death counts only when the record was **alone** at the app; a record merely
    held at the death is delivered again at the count it had. It is a local append-only file (on a
    volume that survives a container restart: an `emptyDir` in the chart), one line per event:

        J1 <group>                     header (the group the journal belongs to)
        I <pid> <consumers> <allowance>  an incarnation started (allowance: see Recovery); C: it stopped
                                       cleanly
        a <topic> <p> <offset> <broker count> <count>   acquired (the broker's count, the sidecar's)
        s <topic> <p> <offset>         sent to the app alone (an isolation turn)
        k <topic> <p> <offset>         answered: accepted or rejected, the broker not told yet
        r / u / d <topic> <p> <offset> released after an attempt / released unsent / done (forgotten)
        v <topic> <p> <offset>         a suspect released unsent (no turn for it in the isolation pass)
        z <topic> <p> <offset>         its incarnation died with it in the state above

    Where: `share.journal.path`, by default (`auto`) `dlq-sidecar/share-journal-<group>` under the user's
    state directory (`$XDG_STATE_HOME`, or `~/.local/state`; `default_journal_path`), the directory
    created if missing; null: no journal. One sidecar per journal: the first to open it holds an exclusive
    `flock` on `<path>.lock` until it closes it (the kernel drops it when the process dies, so a SIGKILL
    leaves no stale lock). A second sidecar of the same group on the same host finds it locked, logs one
    line and runs without a journal, counting as the broker does: a journal must describe one process's
    deliveries, and a second file picked for it (a suffix, a free slot) could be read after a death by a
    process that did not write it, which its header cannot tell.

    Writes go to the file at once without fsync: a SIGKILL of the process keeps them (the page cache is
    the kernel's); a node's crash may lose the last ones, and then those records are counted by the
    broker, as without a journal. Whatever cannot be read (missing, unreadable, another group's, lines
    that do not parse) degrades to the broker's counts for the records concerned, with one log line,
    never to a loss: the journal only ever lowers a count the broker has raised through deaths.
    """

    def __init__(self, path: str, group: str, fh: IO[str] | None) -> None:
        self.path = path
        self.group = group
        self.entries: dict[Coord, Entry] = {}
        self.incarnation = 0
        self.allowance = 0  # Recovery.allowance, carried by this incarnation's line
        self._fh = fh
        self._lock_fh: IO[str] | None = None  # holds the exclusive flock on `<path>.lock`
        self._lines = 0
        # Answers' lines (`answered`) not written yet: they go with the next write (lost in a
        # death: the record is then a suspect, as an answer not yet noted is).
        self._answers: list[str] = []
        self.failed: str | None = None  # why it stopped writing (then counts are the broker's)

    @property
    def active(self) -> bool:
        return self._fh is not None

    @classmethod
    def open(cls, path: str, group: str, consumers: int) -> tuple[ShareJournal, Recovery]:
        """Read the journal at `path` (or start one), compact it, and mark this incarnation's start.

        Every way it can fail is logged once (warning) and leaves the sidecar counting as the broker
        does for the records concerned; only a journal that cannot be written at all is inactive.
        """
        journal = cls(path, group, None)
        recovery = Recovery(False, {}, consumers)
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            journal._lock()
        except BlockingIOError:
            log.warning(
                "share journal %s: in use by another sidecar on this host (%s.lock is locked): "
                "running without a journal, every delivery counted by the broker (a death charges "
                "every record held); give each sidecar of group %r its own share.journal.path",
                path,
                path,
                group,
            )
            journal.failed = "in use by another sidecar"
            return journal, recovery
        except OSError as exc:
            _log_unwritable(path, exc)
            journal.failed = str(exc)
            return journal, recovery
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except FileNotFoundError:
            log.warning(
                "share journal %s: not found, starting a new one; the deliveries of records held "
                "before this start are counted by the broker (a death charged them all)",
                path,
            )
            text = None
        except OSError as exc:
            log.warning(
                "share journal %s: unreadable (%s), starting a new one; the deliveries of records "
                "held before this start are counted by the broker",
                path,
                exc,
            )
            text = None
        if text is not None:
            recovery = journal._replay(text, consumers)
            journal.allowance = recovery.allowance
        try:
            journal._rewrite(consumers)
        except OSError as exc:
            _log_unwritable(path, exc)
            journal.failed = str(exc)
            journal.close()  # inactive from now on
        return journal, recovery

    def _lock(self) -> None:
        """Take the exclusive lock on `<path>.lock` (BlockingIOError: another process has it)."""
        fh = open(f"{self.path}.lock", "a", encoding="utf-8")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            fh.close()
            raise
        self._lock_fh = fh

    def _replay(self, text: str, consumers: int) -> Recovery:
        lines = text.split("\n")
        torn = bool(lines) and lines[-1] != ""  # a SIGKILL mid-write: the last line is cut
        if torn:
            lines.pop()
        elif lines:
            lines.pop()  # the empty string after the last newline
        head = lines[0].split(" ", 1) if lines else []
        if len(head) != 2 or head[0] != "J1":
            log.warning(
                "share journal %s: not a journal (its first line does not parse), starting a new "
                "one; the deliveries of records held before this start are counted by the broker",
                self.path,
            )
            return Recovery(False, {}, consumers)
        if head[1] != self.group:
            log.warning(
                "share journal %s: belongs to group %r, not %r; starting a new one, the deliveries "
                "of records held before this start are counted by the broker",
                self.path,
                head[1],
                self.group,
            )
            return Recovery(False, {}, consumers)
        entries = self.entries
        bad = 0
        clean = True
        last_consumers = consumers
        allowance = 0
        incarnation = 0
        for line in lines[1:]:
            parts = line.split(" ")
            try:
                kind = parts[0]
                if kind == "I":
                    if incarnation:  # the incarnation before died, or stopped cleanly
                        allowance = 0 if clean else allowance + last_consumers
                    if len(parts) > 3:  # carried over a compaction
                        allowance = int(parts[3])
                    incarnation += 1
                    last_consumers = int(parts[2])
                    clean = False
                elif kind == "C":
                    clean = True
                elif kind == HELD:
                    coord = (parts[1], int(parts[2]), int(parts[3]))
                    entries.pop(coord, None)  # re-inserted last: the oldest stay first
                    entries[coord] = Entry(int(parts[4]), int(parts[5]), HELD, incarnation)
                elif kind in _STATES:
                    coord = (parts[1], int(parts[2]), int(parts[3]))
                    if kind == DONE:
                        entries.pop(coord, None)
                    elif (entry := entries.get(coord)) is None:
                        bad += 1
                    elif kind == DIED:
                        entry.died = True
                    else:
                        entry.state = kind
                else:
                    bad += 1
            except (IndexError, ValueError):
                bad += 1
        if bad:
            log.warning(
                "share journal %s: %d lines do not parse (ignored): the records they concern are "
                "counted by the broker",
                self.path,
                bad,
            )
        died = incarnation > 0 and not clean
        held: dict[Coord, Entry] = {}
        for coord, entry in list(entries.items()):
            if died and entry.incarnation == incarnation:
                entry.died = True
                if entry.state in (HELD, ALONE, UNSENT, DEFERRED):  # to come back
                    held[coord] = entry
            elif entry.state in (HELD, ALONE, ANSWERED) and not entry.died:
                entry.state = UNSENT  # held when an incarnation stopped: its close released it
            entry.incarnation = 0
        while len(entries) > _MAX_ENTRIES:
            del entries[next(iter(entries))]
        if died:
            log.warning(
                "share journal %s: the last incarnation died with %d records not answered or "
                "released unsent (%d of them alone at the app): those alone are charged one "
                "delivery, the others none",
                self.path,
                len(held),
                sum(1 for e in held.values() if e.state == ALONE),
            )
        return Recovery(died, held, last_consumers, allowance + last_consumers if died else 0)

    def _rewrite(self, consumers: int) -> None:
        """Write the live entries to a new file and replace the old one with it (atomic rename)."""
        tmp = f"{self.path}.tmp"
        # The incarnation line first: what it is followed by was held by this incarnation (a
        # compaction) or carries its state in lines of its own (RELEASED, UNSENT, DIED, ...).
        self.incarnation += 1
        out = [f"J1 {self.group}\n", f"I {os.getpid()} {consumers} {self.allowance}\n"]
        for (t, p, o), e in self.entries.items():
            out.append(f"{HELD} {t} {p} {o} {e.broker} {e.count}\n")
            if e.state != HELD:
                out.append(f"{e.state} {t} {p} {o}\n")
            if e.died:
                out.append(f"{DIED} {t} {p} {o}\n")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write("".join(out))
        os.replace(tmp, self.path)
        if self._fh is not None:
            self._fh.close()
        self._fh = open(self.path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115
        self._lines = len(out)
        self._consumers = consumers
        for e in self.entries.values():
            e.incarnation = self.incarnation

    # ----------------------------------------------------------------------------- events

    def acquired(self, items: Iterable[tuple[Coord, int, int]]) -> None:
        """Records acquired: (coordinates, the broker's count, the sidecar's count)."""
        lines = []
        entries = self.entries
        for coord, broker, count in items:
            entries.pop(coord, None)
            entries[coord] = Entry(broker, count, HELD, self.incarnation)
            lines.append(f"{HELD} {coord[0]} {coord[1]} {coord[2]} {broker} {count}\n")
        while len(entries) > _MAX_ENTRIES:
            del entries[next(iter(entries))]
        self._write(lines)

    def settled(self, items: Iterable[tuple[Coord, str]]) -> None:
        """Outcomes: (coordinates, ALONE, ANSWERED, RELEASED, UNSENT, DEFERRED or DONE), written now."""
        lines = []
        entries = self.entries
        for coord, kind in items:
            if kind == DONE:
                if entries.pop(coord, None) is None:
                    continue
            elif (entry := entries.get(coord)) is not None:
                entry.state = kind
            else:
                continue
            lines.append(f"{kind} {coord[0]} {coord[1]} {coord[2]}\n")
        self._write(lines)

    def answered(self, coord: Coord, kind: str) -> None:
        """One answer's outcome (ANSWERED or RELEASED), written with the next write (no call to
        the file a record)."""
        entry = self.entries.get(coord)
        if entry is not None:
            entry.state = kind
            self._answers.append(f"{kind} {coord[0]} {coord[1]} {coord[2]}\n")

    def closed_cleanly(self) -> None:
        self._write(["C\n"])
        self.close()

    def close(self) -> None:
        """Close the file and drop the lock; without `closed_cleanly` first, the next start reads
        it as a death."""
        if self._answers:
            self._write([])
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
        if self._lock_fh is not None:
            with contextlib.suppress(OSError):
                self._lock_fh.close()  # releases the flock
            self._lock_fh = None

    def _write(self, lines: list[str]) -> None:
        if self._answers:
            lines = self._answers + lines
            self._answers = []
        if not lines or self._fh is None:
            return
        try:
            self._fh.write("".join(lines))
            self._fh.flush()  # to the kernel: a SIGKILL of this process keeps it
            self._lines += len(lines)
            if self._lines > _COMPACT_LINES:
                self._compact()
        except OSError as exc:
            log.warning(
                "share journal %s: cannot be written (%s): from now on every delivery is counted "
                "by the broker (a death charges every record held)",
                self.path,
                exc,
            )
            self.failed = str(exc)
            self._fh = None

    def _compact(self) -> None:
        incarnation = self.incarnation
        self.incarnation -= 1  # _rewrite counts this incarnation once more
        self._rewrite(self._consumers)
        self.incarnation = incarnation


def _log_unwritable(path: str, exc: OSError) -> None:
    log.warning(
        "share journal %s: cannot be written (%s): running without one, every delivery "
        "counted by the broker (a death charges every record held)",
        path,
        exc,
    )


__all__ = [
    "ALONE",
    "ANSWERED",
    "DEFERRED",
    "DIED",
    "DONE",
    "HELD",
    "RELEASED",
    "UNSENT",
    "Entry",
    "Recovery",
    "ShareJournal",
    "counted",
    "default_journal_path",
    "journal_path",
]
