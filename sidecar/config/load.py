"""The entry points: a YAML file, or already-loaded data, to a validated `Config` or a `ConfigError`.

`load_config` reads the file (UTF-8), parses it with `sidecar.config.yamlcore`, and hands the data
to `parse_config`, which reads the key tables, builds the values and runs the cross-key checks;
every failure, YAML syntax included, leaves as one `ConfigError` naming the file, the dotted path
(or line and column) and the reason, never as a traceback.

Imports: the standard library, PyYAML and the other `sidecar.config` modules except dump/masking.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from sidecar.config.checks import check_config
from sidecar.config.environment import ReadContext
from sidecar.config.errors import ConfigError, Invalid
from sidecar.config.kinds import read_table
from sidecar.config.schema import TOP_KEYS
from sidecar.config.tiers import RetryTiersConfig
from sidecar.config.values import Config, DeadLetterQueueConfig, DeliveryConfig, ErrorsConfig
from sidecar.config.yamlcore import LineLoader


def parse_config(
    data: object, env: Mapping[str, str] | None = None, *, file: str = "<config>"
) -> Config:
    """Validate already-loaded YAML data (`env` defaults to `os.environ`); raise ConfigError."""
    ctx = ReadContext(os.environ if env is None else env)
    try:
        if data is None:
            raise Invalid("", "the configuration is empty; expected a mapping of keys")
        values = read_table(data, "", TOP_KEYS, ctx)
        errors = values.get(ErrorsConfig, {})
        errors["dlq"] = DeadLetterQueueConfig(**values.get(DeadLetterQueueConfig, {}))
        errors["tiers"] = RetryTiersConfig(**values.get(RetryTiersConfig, {}))
        top = values.get(Config, {})
        top["delivery"] = DeliveryConfig(**values.get(DeliveryConfig, {}))
        top["errors"] = ErrorsConfig(**errors)
        top["deprecations"] = tuple(ctx.notes)
        config = Config(**top)
        check_config(config)
    except Invalid as exc:
        raise ConfigError(exc.path, exc.reason, file=file) from None
    return config


def load_config(
    path: str | Path, env: Mapping[str, str] | None = None, *, overlay: str | None = None
) -> Config:
    """Read, substitute and validate the YAML file at `path`; raise ConfigError.

    `overlay`: YAML (or JSON) text of a mapping merged over the file before it is read, maps key by key
    at every depth, anything else replaced (``dlq-sidecar run --overlay``: the injector passes the keys
    it owns this way, over a ConfigMap the team wrote). Its errors name the file ``--overlay``.
    """
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read the file: {exc.strerror or exc}", file=file) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"the file is not UTF-8: {exc.reason}", file=file) from None
    data = _parse_yaml(text, file)
    if overlay is not None:
        over = _parse_yaml(overlay, "--overlay")
        if not isinstance(over, Mapping):
            raise ConfigError("", "must be a mapping of config keys", file="--overlay")
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError("", "expected a mapping of keys at the top level", file=file)
        data = _merged(data or {}, over)
    return parse_config(data, env, file=file)


def _merged(base: Mapping[object, object], over: Mapping[object, object]) -> dict[object, object]:
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            out[key] = _merged(below, value)
        else:
            out[key] = value
    return out


def _parse_yaml(text: str, file: str) -> object:
    try:
        return yaml.load(text, Loader=LineLoader)  # LineLoader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = "; ".join(part for part in (exc.context, exc.problem) if part) or "invalid YAML"
        if mark is None:
            raise ConfigError("", f"invalid YAML: {reason}", file=file) from None
        line, column = mark.line + 1, mark.column + 1
        raise ConfigError(
            f"line {line}, column {column}",
            f"invalid YAML: {reason}",
            file=file,
            line=line,
            column=column,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"invalid YAML: {exc}", file=file) from None
    except RecursionError:  # _MAX_DEPTH should make this unreachable; never a traceback
        raise ConfigError("", "invalid YAML: nested too deeply", file=file) from None
