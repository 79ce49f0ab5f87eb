"""RetryPolicy: exponential backoff with subtractive jitter, pure and validated."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.backoff import RETRY_AFTER_MAX_MS, RetryPolicy


def test_defaults_double_from_one_second_up_to_a_minute() -> None:
    policy = RetryPolicy()
    assert [policy.delay_ms(n, 0.0) for n in range(1, 9)] == [
        1000,
        2000,
        4000,
        8000,
        16000,
        32000,
        60000,
        60000,
    ]


def test_huge_delivery_count_is_capped_without_overflow() -> None:
    assert RetryPolicy().delay_ms(100_000, 0.0) == 60_000
    assert RetryPolicy(multiplier=1.5).base_delay_ms(10**9) == 60_000


def test_jitter_only_shortens_the_delay() -> None:
    policy = RetryPolicy(jitter=0.2)
    assert policy.delay_ms(1, 0.5) == 900
    assert 800 <= policy.delay_ms(1, 0.999999) < 900
    assert RetryPolicy(jitter=0.0).delay_ms(3, 0.9) == 4000


def test_retry_after_overrides_and_is_clamped() -> None:
    policy = RetryPolicy()
    assert policy.delay_ms(1, 0.3, retry_after_ms=5) == 5
    assert policy.delay_ms(6, 0.3, retry_after_ms=0) == 0
    assert policy.delay_ms(1, 0.3, retry_after_ms=-10) == 0
    assert policy.delay_ms(1, 0.3, retry_after_ms=10**12) == RETRY_AFTER_MAX_MS
    assert RetryPolicy(retry_after_max_ms=100).delay_ms(1, 0.0, retry_after_ms=500) == 100


def test_zero_initial_means_no_backoff() -> None:
    assert RetryPolicy(initial_ms=0, max_ms=0).delay_ms(7, 0.5) == 0


def test_constant_backoff_with_multiplier_one() -> None:
    policy = RetryPolicy(initial_ms=250, multiplier=1.0, jitter=0.0)
    assert {policy.delay_ms(n, 0.0) for n in range(1, 50)} == {250}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_ms": -1}, "initial_ms"),
        ({"initial_ms": 10, "max_ms": 5}, "max_ms"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"multiplier": math.nan}, "multiplier"),
        ({"multiplier": math.inf}, "multiplier"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"retry_after_max_ms": -1}, "retry_after_max_ms"),
    ],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("rand", [-0.1, 1.0, 2.0, math.nan])
def test_rand_must_be_in_unit_interval(rand: float) -> None:
    with pytest.raises(ValueError, match="rand"):
        RetryPolicy().delay_ms(1, rand)


def test_delivery_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="delivery_count"):
        RetryPolicy().delay_ms(0, 0.0)


def test_policy_is_immutable() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.initial_ms = 5  # type: ignore[misc]


@settings(max_examples=200, deadline=None)
@given(
    initial=st.integers(0, 10_000),
    extra=st.integers(0, 100_000),
    multiplier=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    count=st.integers(1, 10_000),
    rand=st.floats(0.0, 1.0, exclude_max=True),
)
def test_delay_stays_within_jittered_bounds(
    initial: int, extra: int, multiplier: float, jitter: float, count: int, rand: float
) -> None:
    policy = RetryPolicy(initial, initial + extra, multiplier, jitter)
    base = policy.base_delay_ms(count)
    delay = policy.delay_ms(count, rand)
    assert initial <= base <= policy.max_ms or initial == 0
    assert math.floor(base * (1 - jitter)) - 1 <= delay <= base <= policy.max_ms
    # Without jitter, later attempts never wait less.
    assert policy.base_delay_ms(count + 1) >= base
