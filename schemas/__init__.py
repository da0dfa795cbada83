"""Schemas: pydantic models of change events and domain events, versions and upcasters."""

__all__: list[str] = []
