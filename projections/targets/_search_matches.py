"""Why a search hit matched: for each text field that matched the query, its text with the
matched terms' character ranges (Tantivy's snippets), so a ranking can be explained (a
product whose description holds both words of the query ranks above one whose name holds
one of them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tantivy


@dataclass(frozen=True)
class MatchedText:
    """A field's matched text (the best fragment of it, at most ``MAX_CHARS`` long) and the
    ``[start, end)`` character ranges of the terms that matched in it."""

    text: str
    highlights: tuple[tuple[int, int], ...]

    def marked(self, before: str = "[", after: str = "]") -> str:
        """The text with each matched term between ``before`` and ``after``."""
        parts, done = [], 0
        for start, end in self.highlights:
            parts += [self.text[done:start], before, self.text[start:end], after]
            done = end
        return "".join([*parts, self.text[done:]])

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text, "highlights": [list(r) for r in self.highlights]}


MAX_CHARS = 150


class MatchFinder:
    """Finds, per document of one search, the text fields that matched its query."""

    def __init__(self, searcher: tantivy.Searcher, query: tantivy.Query, schema: tantivy.Schema,
                 fields: Sequence[str]) -> None:
        self._generators = []
        for name in fields:
            generator = tantivy.SnippetGenerator.create(searcher, query, schema, name)
            generator.set_max_num_chars(MAX_CHARS)
            self._generators.append((name, generator))

    def matched(self, document: tantivy.Document) -> dict[str, MatchedText]:
        """Field name → matched text, for the fields where a query term matched."""
        found = {}
        for name, generator in self._generators:
            snippet = generator.snippet_from_doc(document)
            text = snippet.fragment()
            encoded = text.encode()
            # Tantivy's ranges count UTF-8 bytes; MatchedText's count characters.
            ranges = tuple((len(encoded[:r.start].decode()), len(encoded[:r.end].decode()))
                           for r in snippet.highlighted())
            if ranges:
                found[name] = MatchedText(text, ranges)
        return found
