"""Decoding the replication stream: what the source publishes, the replication connection,
the pgoutput messages and the decoder that turns them into store batches.

Inside: the replication connection (``_replication_connection``), the pgoutput message format
(``_pgoutput``), the stateful decoder (``_decoder``) and its extension for lakefold's in-band
messages (``_inband_messages``: snapshot chunks, heartbeats, publication changes), unchanged
TOASTed values (``_toast_fill``), type and key lookups in the source catalog
(``_source_catalog``), and which tables a capture may publish (``_publishable``).

Public here: the LSN text form (``format_lsn``, ``parse_lsn``).
"""

from lakefold.core.wal import format_lsn, parse_lsn

__all__ = ["format_lsn", "parse_lsn"]
