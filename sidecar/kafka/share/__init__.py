"""The share group's Kafka side (`engine: share`, KIP-932): what the share engine needs of confluent-kafka.

    errors    the start-up refusals (`ShareGroupsUnavailable`, `ShareGroupLimitUnsafe`) and the
              translation of a share consumer's `KafkaException`
    admin     the start-up checks through the admin client: share groups known, the group's limit
              (raised where needed) and record lock (`read_share_settings`)
    consumer  the share consumers on their threads, their acknowledgements, behind `ShareListener`

The engine (:mod:`sidecar.engines.share.group`) imports these names and no confluent-kafka.
"""

from sidecar.kafka.share.admin import ShareSettings, check_broker_configs, read_share_settings
from sidecar.kafka.share.consumer import (
    SHARE_REFUSED_PROPERTIES,
    AckCommit,
    ShareListener,
    ShareSource,
    Step,
    share_consumer_properties,
)
from sidecar.kafka.share.errors import (
    ShareGroupLimitUnsafe,
    ShareGroupsUnavailable,
    refusal_from_error,
)

__all__ = [
    "SHARE_REFUSED_PROPERTIES",
    "AckCommit",
    "ShareGroupLimitUnsafe",
    "ShareGroupsUnavailable",
    "ShareListener",
    "ShareSettings",
    "ShareSource",
    "Step",
    "check_broker_configs",
    "read_share_settings",
    "refusal_from_error",
    "share_consumer_properties",
]
