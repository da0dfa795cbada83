"""Event store: an append-only PostgreSQL log of domain events with a gap-free global order."""

__all__: list[str] = []
