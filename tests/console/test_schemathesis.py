"""Schemathesis against the console's OpenAPI document, on the running system: every
operation (the event stream aside: it never ends) answers what the document says, with no
server error, for generated valid and invalid input (every check of ``call_and_validate``).
Runs after the other console tests (file order): it may retry or drop the system's dead
letters.

(schemathesis' own pytest plugin, ``from_fixture``, does not work with this pytest; the
operations are driven with hypothesis directly.)"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from tests.console.conftest import System

pytestmark = pytest.mark.timeout(300)


# schemathesis' negative strategies call `random` inside a strategy, which hypothesis
# deprecates (a warning about schemathesis' code, not ours).
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_the_api_answers_as_its_openapi_document_says(system: System) -> None:
    schema = schemathesis.openapi.from_url(system.url + "/openapi.json") \
        .exclude(path="/api/stream")
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), "the OpenAPI document has invalid operations"
    assert len(operations) >= 19
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=15, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: schemathesis.Case[Any]) -> None:
                case.call_and_validate()

            try:
                check()
            except Unsatisfiable:
                # no invalid input exists for an operation without parameters or body
                assert mode is GenerationMode.NEGATIVE
