"""Capture: logical replication (pgoutput) into durable, compacted changelog streams."""

__all__: list[str] = []
