"""The YAML loader: YAML 1.2 core-schema scalars, a little stricter, with hard limits.

Owns `LineLoader` (which scalars mean what, and the limits: its docstring); every failure is a
`yaml.YAMLError` with a mark.

Imports: the standard library and PyYAML only; it knows nothing of the configuration's keys.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

# A configuration is four levels deep; PyYAML's composer recurses once per level and would end in a
# RecursionError (a traceback) near a thousand.
_MAX_DEPTH = 64
# CPython's limit for int <-> str conversion (sys.get_int_max_str_digits); fixed here so the error
# does not depend on the interpreter's setting.
_MAX_INT_DIGITS = 4300
_INT_TEXT = re.compile(r"[-+]?[0-9]+")


class LineLoader(yaml.SafeLoader):
    """The strict core-schema loader.

    Only ``true``/``false`` are booleans, integers are decimal without leading zeros (``0123`` stays
    the string ``"0123"``), and there are no sexagesimal numbers or timestamps; duplicate keys are
    rejected. YAML 1.1 would silently turn ``0123`` into 83 or ``no`` into ``False``, which is how
    passwords and topic names get corrupted. The limits, so no file ends in a traceback: nesting at
    most `_MAX_DEPTH` levels, integers of at most `_MAX_INT_DIGITS` digits, and only the core schema's
    tags (``!!str``, ``!!int``, ``!!float``, ``!!bool``, ``!!null``, ``!!seq``, ``!!map``). Every
    failure is a `yaml.YAMLError` with a mark.
    """

    yaml_implicit_resolvers: dict[Any, Any] = {}
    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {_MAX_DEPTH} levels deep", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping, found a {_node_kind(node)}", node.start_mark
            )
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: let the base class report it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _node_kind(node: yaml.Node) -> str:
    return str(getattr(node, "id", "node"))


def _scalar_node(node: yaml.Node, tag: str) -> yaml.ScalarNode:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(
            None, None, f"{tag} needs a scalar, found a {_node_kind(node)}", node.start_mark
        )
    return node


def _scalar_text(loader: yaml.SafeLoader, node: yaml.Node, tag: str) -> str:
    return str(loader.construct_scalar(_scalar_node(node, tag)))


def _bad_scalar(node: yaml.Node, reason: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, reason, node.start_mark)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = _scalar_text(loader, node, "!!int")
    if not _INT_TEXT.fullmatch(text):
        raise _bad_scalar(node, f"!!int needs a decimal integer, got {text[:40]!r}")
    digits = len(text.lstrip("+-"))
    try:
        if digits <= _MAX_INT_DIGITS:
            return int(text)
    except ValueError:  # the interpreter's own limit is lower
        pass
    raise _bad_scalar(node, f"an integer of {digits} digits is too large for any setting")


# YAML 1.2 core-schema floats (and integers, which a `!!float` tag may carry).
_FLOAT_TEXT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    scalar = _scalar_node(node, "!!float")
    text = str(loader.construct_scalar(scalar))
    # Checked before PyYAML's constructor, which raises IndexError on an empty `!!float`.
    if not _FLOAT_TEXT.fullmatch(text):
        raise _bad_scalar(node, f"!!float needs a number, got {text[:40]!r}")
    return float(loader.construct_yaml_float(scalar))


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    text = _scalar_text(loader, node, "!!bool")
    if text.lower() not in ("true", "false"):
        raise _bad_scalar(node, f"!!bool needs true or false, got {text[:40]!r}")
    return text.lower() == "true"


# The core schema's tags only: no !!binary, !!timestamp, !!set, !!omap or !!pairs (a configuration
# has no use for them, and PyYAML's constructors for them raise plain Python errors on bad input).
# A tag without a constructor falls to the `None` entry: a ConstructorError naming the tag.
_CORE_TAGS = tuple(
    f"tag:yaml.org,2002:{name}" for name in ("null", "str", "seq", "map", "bool", "int", "float")
)


def _add_core_schema(loader: type[yaml.SafeLoader]) -> None:
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
    )
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
    )
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?[0-9]+[eE][-+]?[0-9]+"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+.0123456789"),
    )
    loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^<<$"), ["<"])
    loader.yaml_constructors = {
        tag: fn
        for tag, fn in yaml.SafeLoader.yaml_constructors.items()
        if tag is None or tag in _CORE_TAGS
    }
    # PyYAML's own int constructor reads a leading 0 as octal and accepts 0x/0b/1_000/1:30.
    loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
    loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


_add_core_schema(LineLoader)
