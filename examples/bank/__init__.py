"""A small bank, event-sourced: ``python -m examples.bank`` (see ``__main__``)."""
