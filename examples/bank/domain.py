"""The bank's domain: its events (registered, with an upcaster), the ``Account`` aggregate and
the command handlers an application calls."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel

from lakefold.eventstore import Aggregate, EventStore, Repository, when
from lakefold.schemas import EventRegistry

registry = EventRegistry()


@registry.event("account.opened")
class Opened(BaseModel):
    owner: str


@registry.event("account.deposited", version=2)
class Deposited(BaseModel):
    amount: int  # cents; version 1 called it "cents"


@registry.event("account.withdrawn")
class Withdrawn(BaseModel):
    amount: int


@registry.upcaster("account.deposited", from_version=1)
def _amount_was_cents(data: dict[str, object]) -> dict[str, object]:
    return {"amount": data["cents"]}


class InsufficientFunds(Exception):
    """A withdrawal or transfer larger than the balance."""


class Account(Aggregate):
    category = "account"

    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.owner = ""
        self.balance = 0
        self.movements = 0

    @classmethod
    def open(cls, id: str, owner: str) -> Self:
        account = cls(id)
        account.raise_event(Opened(owner=owner))
        return account

    def deposit(self, amount: int) -> None:
        if amount <= 0:
            raise ValueError("deposit a positive amount")
        self.raise_event(Deposited(amount=amount))

    def withdraw(self, amount: int) -> None:
        if amount > self.balance:
            raise InsufficientFunds(f"account {self.id} holds {self.balance}, not {amount}")
        self.raise_event(Withdrawn(amount=amount))

    @when(Opened)
    def _opened(self, event: Opened) -> None:
        self.owner = event.owner

    @when(Deposited)
    def _deposited(self, event: Deposited) -> None:
        self.balance += event.amount
        self.movements += 1

    @when(Withdrawn)
    def _withdrawn(self, event: Withdrawn) -> None:
        self.balance -= event.amount
        self.movements += 1


class Bank:
    """The command handlers: each loads, acts and saves, again on a concurrent save."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.accounts = Repository(store, Account, snapshot_every=20)

    def open(self, id: str, owner: str) -> None:
        self.accounts.save(Account.open(id, owner))

    def deposit(self, id: str, amount: int) -> None:
        self.accounts.update(id, lambda account: account.deposit(amount))

    def transfer(self, source: str, target: str, amount: int) -> None:
        """Both accounts in one transaction, with an audit row written by our own SQL."""
        def once() -> None:
            debit, credit = self.accounts.get(source), self.accounts.get(target)
            debit.withdraw(amount)
            credit.deposit(amount)
            with self.store.transaction() as unit:
                self.accounts.save(debit, credit, unit=unit)
                unit.connection.execute(
                    "INSERT INTO transfers (source, target, amount) VALUES (%s, %s, %s)",
                    (source, target, amount))

        self.accounts.retry(once)

    def balance(self, id: str) -> int:
        return self.accounts.get(id).balance
