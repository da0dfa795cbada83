"""What lakefold's other packages build on in ``lakefold.eventstore``, beyond its user API: each
name here is imported by another package, which may import no private module of this one (the
layer test counts such imports: none). Not for users: no stability promise. Loaded lazily, like
the package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakefold.core.lazy import by_module, lazy_getattr

if TYPE_CHECKING:
    from lakefold.eventstore._commit_markers import (
        database_identity as database_identity,
        install_commit_markers as install_commit_markers,
        transaction_ranges as transaction_ranges,
        wal_insert_lsn as wal_insert_lsn,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "lakefold.eventstore._commit_markers": (
        "database_identity", "install_commit_markers", "transaction_ranges",
        "wal_insert_lsn",
    ),
}

__getattr__ = lazy_getattr("lakefold.eventstore.internals", by_module(_EXPORTS))
