"""The demo's order stream: a seeded mix of orders (ok, poison, flaky, slow) and what the bundled app's
decision rule makes of it (`expected_outcomes`, which the demo's summary checks).

Pure: the standard library only.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

# The order mix, in percent: the rest are "ok". A quarter of the flaky orders never recover and
# are archived at the delivery limit; the others are released twice, then accepted.
POISON_PCT = 3
FLAKY_PCT = 6
SLOW_PCT = 3
HOPELESS_FAILS = 99
CUSTOMERS = 200


@dataclass(frozen=True, slots=True)
class Order:
    key: bytes
    value: bytes
    kind: str  # ok | poison | flaky | hopeless | slow


def plan_orders(n: int, seed: int) -> list[Order]:
    """A reproducible stream of orders keyed by customer."""
    rng = random.Random(seed)
    orders = []
    for i in range(n):
        roll = rng.randrange(100)
        kind = "ok"
        if roll < POISON_PCT:
            kind = "poison"
        elif roll < POISON_PCT + FLAKY_PCT:
            kind = "hopeless" if rng.randrange(4) == 0 else "flaky"
        elif roll < POISON_PCT + FLAKY_PCT + SLOW_PCT:
            kind = "slow"
        customer = f"customer-{rng.randrange(CUSTOMERS):03d}"
        body: dict[str, Any] = {
            "id": f"o-{i + 1:05d}",
            "kind": "flaky" if kind == "hopeless" else kind,
            "customer": customer,
            "amount": round(rng.uniform(5, 500), 2),
        }
        if kind == "hopeless":
            body["fails"] = HOPELESS_FAILS
        orders.append(Order(customer.encode(), json.dumps(body).encode(), kind))
    return orders


@dataclass(frozen=True, slots=True)
class Expected:
    """What the bundled app's decision rule must produce for a planned stream."""

    accepted: int
    rejected: int
    exhausted: int
    attempts: int

    @property
    def archived(self) -> int:
        return self.rejected + self.exhausted


def expected_outcomes(orders: list[Order], delivery_limit: int) -> Expected:
    kinds = [o.kind for o in orders]
    n_flaky, n_hopeless = kinds.count("flaky"), kinds.count("hopeless")
    # A flaky order is released at deliveries 1 and 2 and accepted at the 3rd (if the limit allows).
    flaky_ok = n_flaky if delivery_limit >= 3 else 0
    exhausted = n_hopeless + n_flaky - flaky_ok
    return Expected(
        accepted=kinds.count("ok") + kinds.count("slow") + flaky_ok,
        rejected=kinds.count("poison"),
        exhausted=exhausted,
        attempts=kinds.count("ok")
        + kinds.count("slow")
        + kinds.count("poison")
        + 3 * flaky_ok
        + delivery_limit * exhausted,
    )


__all__ = ["Expected", "Order", "expected_outcomes", "plan_orders"]
