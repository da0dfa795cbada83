"""Arrow table helpers every package shares."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def latest_per_key(rows: pa.Table, keys: list[str] | tuple[str, ...], *,
                   order: str | None = None) -> pa.Table:
    """One row per key: the one with the highest ``order`` column (without ``order``, and
    among ties, the last one), in the order those rows come in ``rows`` once sorted."""
    if rows.num_rows < 2:
        return rows
    index = pa.array(np.arange(rows.num_rows, dtype=np.int64))
    ranked = rows.append_column("__order", index)
    if order is not None:
        ranked = ranked.sort_by([(order, "ascending"), ("__order", "ascending")])
        ranked = ranked.set_column(ranked.schema.get_field_index("__order"), "__order", index)
    last = ranked.select([*keys, "__order"]).group_by(list(keys), use_threads=False) \
        .aggregate([("__order", "max")]).column("__order_max")
    return ranked.take(pc.take(last, pc.sort_indices(last))).drop_columns(["__order"])
