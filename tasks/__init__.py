"""Prefect tasks: each one is a single call into storage/ or ntp/ (policies sit on the decorators)."""
