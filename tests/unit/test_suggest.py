"""The "did you mean" (sidecar.config.suggest): typos, and names that are only alike."""

from __future__ import annotations

from sidecar.config.suggest import closest


def test_a_typo_of_a_topic_name_is_found_and_a_shared_suffix_is_not_a_typo() -> None:
    topics = ["payments-2f9c", "orders-2f9c", "src-test-a-missing-topic-038c0424"]
    assert closest("paymnets-2f9c", topics, typos_only=True) == "payments-2f9c"
    assert closest("nope-test-a-missing-topic-038c0424", topics, typos_only=True) is None
    # Without typos_only, difflib finds the long shared part alike (right for config keys).
    assert closest("nope-test-a-missing-topic-038c0424", topics) is not None
