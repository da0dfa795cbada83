"""A view over the bank's events: each account's balance and number of movements, in a Delta
table (``lakefold run -p examples/bank/projections.py``)."""

from examples.bank.domain import Deposited, Withdrawn, registry
from lakefold import delta_table, events, view

balances = view(
    "balances", registry=registry,
    inputs={"moves": events("account", types=[Deposited, Withdrawn])},
    key=["account"], target=delta_table("upsert", keys=["account"]), query="""
    SELECT stream_id AS account,
           sum(CASE WHEN type = 'account.deposited' THEN amount ELSE -amount END) AS balance,
           count(*) AS movements
    FROM moves GROUP BY stream_id""")
