"""The reliability suite: faults injected while records flow, each run judged by tests.checker."""
