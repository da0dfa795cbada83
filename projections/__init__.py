"""Projections: user-defined views kept up to date in Delta, Redis and search, and rebuilt."""

__all__: list[str] = []
