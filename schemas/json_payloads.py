"""Many JSON payloads parsed at once into Arrow, without a Python object per payload.

``parse_payloads(texts, schema)`` hands the payloads' character data, a line end after each, to
Arrow's newline-delimited JSON reader: one row per payload, typed by ``schema`` (fields it lacks
are ignored), or with ``schema=None`` typed as the reader infers them. JSON text has newlines
only as whitespace (never raw inside a string), so a payload spanning lines parses too; if such
a payload straddles one of the reader's blocks, the payloads are parsed again with their
newlines as spaces.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

# 1 MiB blocks parse a third faster than one block of everything (cache-sized).
_BLOCK = 1 << 20


def _lines(texts: pa.Array) -> pa.Buffer:
    """The character data of ``texts``, a line end after each."""
    lines = pc.binary_join_element_wise(texts, "", "\n")
    _, offsets, chars = lines.buffers()
    width = np.int64 if pa.types.is_large_string(lines.type) else np.int32
    bounds = np.frombuffer(offsets, dtype=width)[[lines.offset, lines.offset + len(lines)]]
    return chars.slice(int(bounds[0]), int(bounds[1] - bounds[0]))


def _read(texts: pa.Array, schema: pa.Schema | None) -> pa.Table:
    payload = _lines(texts)
    # With inference, one block: every payload then counts towards one type per field.
    block = _BLOCK if schema is not None else max(_BLOCK, payload.size + 1)
    parse = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore") \
        if schema is not None else pajson.ParseOptions(unexpected_field_behavior="infer")
    # one thread: Spark runs a task per core, and a sealer shares the machine with writers
    return pajson.read_json(pa.BufferReader(payload), parse_options=parse,
                            read_options=pajson.ReadOptions(block_size=block, use_threads=False))


def parse_payloads(texts: pa.Array, schema: pa.Schema | None) -> pa.Table:
    """One row per payload of ``texts`` (non-null JSON objects); ArrowInvalid when one is
    not such an object or does not fit ``schema`` (or, inferring, when a field holds values
    of different JSON types)."""
    try:
        table = _read(texts, schema)
    except pa.ArrowInvalid:
        table = _read(pc.replace_substring(texts, "\n", " "), schema)
    if table.num_rows != len(texts):
        raise pa.ArrowInvalid(f"{len(texts)} JSON payloads parsed as {table.num_rows} rows")
    return table
