"""Fault injectors and the journaled workload for the reliability suite (tests/reliability)."""
