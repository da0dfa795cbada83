"""Lakefold errors that come back from Spark as text (a failed Python worker, a failed
foreachBatch function) are classified by the marker they carry, not by their class names."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from lakefold.core.exceptions import LakefoldError, marker_in
from lakefold.projections.exceptions import RecordFailedError, TargetUnavailableError
from lakefold.projections.runtime._runner import _describe, _terminal

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

ERRORS: list[tuple[type[LakefoldError], bool]] = [(TargetUnavailableError, True),
                                                 (RecordFailedError, False)]


def _raiser(kind: type[LakefoldError]) -> Callable[..., None]:
    def fail(*_: object) -> None:
        raise kind(f"{kind.__name__} raised on purpose")
    return fail


@pytest.mark.parametrize(("kind", "transient"), ERRORS, ids=["transient", "terminal"])
def test_an_error_from_a_python_worker_is_classified_by_its_marker(
        spark: SparkSession, kind: type[LakefoldError], transient: bool) -> None:
    fail = _raiser(kind)

    def batches(_: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fail()
        yield from ()

    with pytest.raises(Exception) as caught:
        spark.range(1).mapInArrow(batches, "id long").collect()
    error = caught.value
    assert not isinstance(error, LakefoldError)  # it came back wrapped, as text
    marker = marker_in(str(error))
    assert marker is not None
    assert (marker.code, marker.transient) == (kind.__name__, transient)
    assert _terminal(error) is not transient
    assert _describe(error) == f"{kind.__name__}: {kind.__name__} raised on purpose"


@pytest.mark.parametrize(("kind", "transient"), ERRORS, ids=["transient", "terminal"])
def test_an_error_from_foreach_batch_is_classified_by_its_marker(
        spark: SparkSession, kind: type[LakefoldError], transient: bool) -> None:
    fail = _raiser(kind)
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
             .writeStream.foreachBatch(fail).trigger(processingTime="0 seconds").start())
    try:
        with pytest.raises(Exception) as caught:
            query.awaitTermination(120)
    finally:
        query.stop()
    error = caught.value
    assert not isinstance(error, LakefoldError)
    marker = marker_in(str(error))
    assert marker is not None
    assert (marker.code, marker.transient) == (kind.__name__, transient)
    assert _terminal(error) is not transient


def test_a_plain_error_wrapping_a_lakefold_error_is_not_taken_for_it() -> None:
    """Only the error a traceback ends with counts: a builtin raised from a terminal
    lakefold error is not classified as terminal."""
    import traceback

    try:
        try:
            raise RecordFailedError("inner")
        except RecordFailedError as e:
            raise RuntimeError("outer") from e
    except RuntimeError as e:
        text = "".join(traceback.format_exception(e))
    assert "[lakefold-error code=RecordFailedError transient=false]" in text
    assert marker_in(text) is None
