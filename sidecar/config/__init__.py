"""The sidecar's configuration: the YAML schema, `${ENV}` substitution, validation and typed values.

This package owns the configuration file (docs/configuration.md) and the start-up checks of the DLQ
(a bad DLQ topic name is a configuration error, not a runtime surprise). It turns one YAML file into a tree of frozen dataclasses, or raises
`ConfigError` naming the offending key's dotted path and the reason; the CLI prints
``str(error)`` and exits 2. The public names are re-exported here; import them from
``sidecar.config``, not from the modules below.

    errors       ConfigError, and the readers' internal Invalid
    syntax       topic names, loopback hosts, listen addresses, Unix socket paths, the app URL
    values       the enums and frozen dataclasses (defaults live here only)
    environment  ${NAME} / ${NAME:-default} substitution; every value has a UTF-8 encoding
    kinds        value kinds (strict typing) and the key-table reader
    schema       the key tables, and the readers of the odd keys (kafka, topics, headers, ...)
    suggest      the "did you mean" of an unknown name (edit distance)
    librdkafka   the `kafka:` properties checked by librdkafka itself (ctypes, no broker)
    checks       cross-key rules, API listeners, DLQ topic names
    tiers        the retry tiers: delays, threshold, tier topic names (and their check)
    routes       errors.deadletterqueue.routes and routes.app.allowed: read, checked, DlqRoutes
    yamlcore     the strict YAML 1.2 core-schema loader with hard limits
    load         load_config / parse_config: file or data to Config, or ConfigError
    masking      which values are secrets, by name
    dump         dump_config: the effective configuration as plain data, masked

Imports: the standard library, PyYAML and `sidecar.core` (``Ordering``) only (librdkafka is loaded
through ctypes, not imported); every other layer may import this one.
"""

from __future__ import annotations

from sidecar.config.dump import dump_config
from sidecar.config.errors import ConfigError
from sidecar.config.load import load_config, parse_config
from sidecar.config.masking import is_secret_header, is_secret_kafka_property
from sidecar.config.routes import dlq_routes
from sidecar.config.syntax import ListenAddress, is_loopback_host, parse_listen, topic_name_error
from sidecar.config.values import *  # noqa: F403 (its __all__, re-exported below)
from sidecar.config.values import __all__ as _values_all
from sidecar.core.ordering import Ordering  # the one copy

__all__ = [
    "ConfigError",
    "ListenAddress",
    "Ordering",
    "dlq_routes",
    "dump_config",
    "is_loopback_host",
    "is_secret_header",
    "is_secret_kafka_property",
    "load_config",
    "parse_config",
    "parse_listen",
    "topic_name_error",
]
__all__.extend(_values_all)  # the values' names: the enums, the dataclasses, JOURNAL_AUTO
