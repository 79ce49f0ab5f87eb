"""The sidecar's configuration: the YAML schema, `${ENV}` substitution, validation and typed values.

Owns the configuration file (docs/configuration.md) and the start-up checks of the DLQ: one YAML file
to a tree of frozen dataclasses, or `ConfigError` naming the key's dotted path and the reason (the CLI
prints it and exits 2). The public names are re-exported here; import them from ``sidecar.config``
(docs/architecture.md lists the modules).

Imports: the standard library, PyYAML and `sidecar.core` only (librdkafka is loaded through ctypes, not
imported); every other layer may import this one.
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
