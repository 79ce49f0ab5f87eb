"""The "did you mean" of every unknown name: the closest known name, by edits a typist makes.

Owns `closest(name, names)`: the known name at the fewest edits from `name` (a letter added,
dropped or changed, or two neighbours swapped, as in ``ulr`` for ``url``), within a bound that
grows with the name's length; failing that, a close match by `difflib` (whole words swapped or
misplaced; not with `typos_only`). None when nothing is close enough to be a likely typo.

Imports: the standard library only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def _edits(a: str, b: str, limit: int) -> int:
    """The optimal-string-alignment distance of `a` and `b`, or `limit + 1` once it is over `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        before, row = row, current
    return row[len(b)]


def closest(name: str, names: Iterable[str], *, typos_only: bool = False) -> str | None:
    """The known name `name` most likely misspells, or None. `typos_only`: by edits alone (no
    `difflib` match: names that share a long part, as topic names with one suffix do, are alike
    to it without being typos of each other)."""
    known = sorted(set(names))
    if name in known:
        return name
    limit = 1 if len(name) <= 4 else 2 if len(name) <= 12 else 3
    best: tuple[int, str] | None = None
    for candidate in known:
        distance = _edits(name.lower(), candidate.lower(), limit)
        if distance <= limit and (best is None or distance < best[0]):
            best = (distance, candidate)
    if best is not None:
        return best[1]
    if typos_only:
        return None
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return close[0] if close else None
