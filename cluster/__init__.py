"""Idempotent distributed counters: pure data structures, node logic and transport."""
