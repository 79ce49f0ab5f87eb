"""Value kinds and the key-table reader: how one raw YAML value, and one mapping, are read.

Owns the kinds (`IntKey` ... `Section`: strict typing, told at `read_table`) and `read_table`.

Imports: the standard library, `sidecar.config.errors`, `sidecar.config.environment` and
`sidecar.config.suggest`; not the tables themselves (`sidecar.config.schema`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.config.environment import ReadContext, encodable
from sidecar.config.errors import Invalid
from sidecar.config.suggest import closest


def int_text(value: int) -> str:
    # str() of an int past 4,300 digits raises; no setting is near 20 digits anyway.
    return str(value) if -(10**20) < value < 10**20 else "an integer of more than 20 digits"


def describe_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({int_text(value)})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Kind:
    def read(self, raw: object, path: str, ctx: ReadContext) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


_QUOTED_NUMBER = re.compile(r"\s*[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*")
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|min|h|d)\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _number_hint(raw: str, path: str) -> str:
    """What to write instead of a string where a number goes: a quoted number loses its quotes;
    a duration under a `.ms` key is the number of milliseconds; anything else gets no advice."""
    if _QUOTED_NUMBER.fullmatch(raw):
        return "; write numbers without quotes"
    duration = _DURATION.fullmatch(raw)
    if duration and path.endswith(".ms"):
        ms = float(duration.group(1)) * _UNIT_MS[duration.group(2)]
        return f"; the unit is in the key's name: write {ms:.0f} (milliseconds)"
    return ""


def _number_text(raw: str, path: str, ctx: ReadContext, what: str) -> str:
    """A number written as a string: only a whole `${VAR}` reference may be one (its value)."""
    text, whole = ctx.expand(raw, path)
    if not whole:
        raise Invalid(path, f"expected {what}, got {describe_value(raw)}{_number_hint(raw, path)}")
    return text


@dataclass(frozen=True, slots=True)
class IntKey(_Kind):
    lo: int
    hi: int
    also: tuple[int, ...] = ()  # sentinel values outside the range, e.g. -1 = broker default

    def read(self, raw: object, path: str, ctx: ReadContext) -> int:
        value = raw
        if isinstance(raw, str):
            text = _number_text(raw, path, ctx, "an integer")
            digits = text.strip()
            if not re.fullmatch(r"[-+]?[0-9]+", digits):
                raise Invalid(path, f"expected an integer from the environment, got {text!r}")
            if len(digits) > 20:
                raise Invalid(path, f"must be {self.describe()}, got {len(digits)} digits")
            value = int(digits)
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(path, f"expected an integer, got {describe_value(value)}")
        if not (self.lo <= value <= self.hi or value in self.also):
            raise Invalid(path, f"must be {self.describe()}, got {int_text(value)}")
        return value

    def describe(self) -> str:
        extra = "".join(f" or {v}" for v in self.also)
        return f"an integer in {self.lo}..{self.hi}{extra}"


@dataclass(frozen=True, slots=True)
class FloatKey(_Kind):
    lo: float
    hi: float

    def read(self, raw: object, path: str, ctx: ReadContext) -> float:
        value = raw
        if isinstance(raw, str):
            text = _number_text(raw, path, ctx, "a number")
            try:
                value = float(text)
            except ValueError:
                raise Invalid(
                    path, f"expected a number from the environment, got {text!r}"
                ) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(path, f"expected a number, got {describe_value(value)}")
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = math.inf
        if not math.isfinite(number) or not self.lo <= number <= self.hi:
            shown = int_text(value) if isinstance(value, int) else value
            raise Invalid(path, f"must be {self.describe()}, got {shown}")
        return number

    def describe(self) -> str:
        return f"a number in {self.lo}..{self.hi}"


@dataclass(frozen=True, slots=True)
class BoolKey(_Kind):
    def read(self, raw: object, path: str, ctx: ReadContext) -> bool:
        if isinstance(raw, str):
            text, whole = ctx.expand(raw, path)
            if whole and text.strip().lower() in ("true", "false"):
                return text.strip().lower() == "true"
            if whole:
                raise Invalid(path, f"expected true or false from the environment, got {text!r}")
            raise Invalid(path, f"expected true or false, got {describe_value(raw)}")
        if not isinstance(raw, bool):
            raise Invalid(path, f"expected true or false, got {describe_value(raw)}")
        return raw

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True, slots=True)
class StrKey(_Kind):
    allow_empty: bool = True
    check: Callable[[str], str | None] | None = None  # returns a reason when the value is bad

    def read(self, raw: object, path: str, ctx: ReadContext) -> str:
        if not isinstance(raw, str):
            raise Invalid(path, f"expected a string, got {describe_value(raw)}")
        text, _ = ctx.expand(raw, path)
        if not text and not self.allow_empty:
            raise Invalid(path, "must not be empty")
        if self.check is not None:
            problem = self.check(text)
            if problem:
                raise Invalid(path, problem)
        return text

    def describe(self) -> str:
        return "a string"


@dataclass(frozen=True, slots=True)
class ChoiceKey(_Kind):
    enum: type[StrEnum]

    def read(self, raw: object, path: str, ctx: ReadContext) -> StrEnum:
        text = StrKey().read(raw, path, ctx)
        try:
            return self.enum(text)
        except ValueError:
            raise Invalid(path, f"must be {self.describe()}, got {text!r}") from None

    def describe(self) -> str:
        return "one of " + ", ".join(member.value for member in self.enum)


@dataclass(frozen=True, slots=True)
class CustomKey(_Kind):
    reader: Callable[[object, str, ReadContext], Any]
    text: str

    def read(self, raw: object, path: str, ctx: ReadContext) -> Any:
        return self.reader(raw, path, ctx)

    def describe(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Key:
    """One YAML key: its name, its kind, and the dataclass attribute that receives the value.

    `replaced_by`: the key is an old name of that one, still read (with a deprecation note, see
    `read_table`), never written (`sidecar.config.dump`), and an error when both are set.
    """

    name: str
    kind: _Kind
    owner: type
    attr: str
    replaced_by: str | None = None


@dataclass(frozen=True, slots=True)
class Section(_Kind):
    """A nested mapping whose keys all belong to the dataclass `owner`."""

    owner: type
    keys: tuple[Key, ...]
    derived_from: str | None = None  # the key whose value __post_init__ parses (may raise)

    def read(self, raw: object, path: str, ctx: ReadContext) -> Any:
        # An emptied section (`api:` with every child commented out) means "all defaults".
        values = read_table({} if raw is None else raw, path, self.keys, ctx)
        try:
            return self.owner(**values.get(self.owner, {}))
        except ValueError as exc:
            if self.derived_from is None:
                raise
            raise Invalid(join_path(path, self.derived_from), str(exc)) from None

    def describe(self) -> str:
        return "a mapping"


def mapping_at(raw: object, path: str) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise Invalid(path, f"expected a mapping, got {describe_value(raw)}")
    for key in raw:
        if not isinstance(key, str):
            raise Invalid(
                join_path(path, describe_key(key)),
                f"keys must be strings, got {describe_value(key)}",
            )
        encodable(key, join_path(path, key))
    return raw


def describe_key(key: object) -> str:
    return int_text(key) if isinstance(key, int) and not isinstance(key, bool) else str(key)


def _required(owner: type, attr: str) -> bool:
    spec = next(f for f in dataclasses.fields(owner) if f.name == attr)
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def read_table(
    raw: object, path: str, keys: tuple[Key, ...], ctx: ReadContext
) -> dict[type, dict[str, Any]]:
    """Read a mapping against a key table: unknown keys first, then each key in table order.

    A kind (`IntKey`, `FloatKey`, `BoolKey`, `StrKey`, `ChoiceKey`, `CustomKey`, `Section`) reads a raw value at
    a dotted path or raises `Invalid`. Typing is strict on purpose: a quoted ``"100"`` or ``true``
    where an integer is expected is an error; only a value that is entirely an environment reference
    is converted. `read_table` reads a mapping against a tuple of `Key` (YAML name, kind, owning
    dataclass attribute): unknown keys first (with a suggestion), then each key in table order, and
    a key is required exactly when its attribute has no default.
    """
    data = mapping_at(raw, path)
    known = {key.name: key for key in keys}
    for name in data:
        if name not in known:
            raise Invalid(join_path(path, name), _unknown_key_reason(name, path, keys))
    values: dict[type, dict[str, Any]] = {}
    for key in keys:
        key_path = join_path(path, key.name)
        if key.name in data:
            if key.replaced_by is not None:
                new_path = join_path(path, key.replaced_by)
                if key.replaced_by in data:
                    raise Invalid(
                        key_path,
                        f"the old name of {new_path}, which is set too: keep {new_path} only",
                    )
                ctx.notes.append(
                    f"{key_path} is deprecated: it is now {new_path} (same value and meaning); "
                    "the old name is still read"
                )
            values.setdefault(key.owner, {})[key.attr] = key.kind.read(
                data[key.name], key_path, ctx
            )
        elif key.replaced_by is None and _required(key.owner, key.attr):
            raise Invalid(key_path, f"required key is missing ({key.kind.describe()})")
    return values


def _unknown_key_reason(name: str, path: str, keys: tuple[Key, ...]) -> str:
    names = [key.name for key in keys]
    if not path:
        # Two frequent mistakes: nesting the seeds' flat names (errors: {tolerance: ...}), and
        # writing a section's key flat (app.timeout.ms: ...).
        flat = [n for n in names if n.startswith(name + ".")]
        if flat:
            return f"unknown key; the {name}.* properties are written flat, e.g. '{flat[0]}'"
        for key in keys:
            if isinstance(key.kind, Section) and name.startswith(key.name + "."):
                rest = name[len(key.name) + 1 :]
                if any(k.name == rest for k in key.kind.keys):
                    return f"unknown key; write it as '{rest}' under '{key.name}:'"
    close = closest(name, names)
    if close:
        return f"unknown key; did you mean '{close}'?"
    where = f"'{path}'" if path else "the top level"
    return f"unknown key; the keys allowed at {where} are: {', '.join(names)}"
