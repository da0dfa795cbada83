"""A small domain for the aggregate tests: bank accounts with deposits, withdrawals and
transfers; ``Deposited`` has a version 1 that called the amount ``cents``."""

from __future__ import annotations

from pydantic import BaseModel

from lakefold.eventstore import Aggregate, when
from lakefold.schemas import EventRegistry


class Opened(BaseModel):
    owner: str


class Deposited(BaseModel):
    amount: int


class Withdrawn(BaseModel):
    amount: int


class Renamed(BaseModel):  # registered in no registry: saving it is refused
    owner: str


class InsufficientFunds(Exception):
    pass


def registry() -> EventRegistry:
    types = EventRegistry()
    types.add(Opened, name="account.opened")
    types.add(Deposited, name="account.deposited", version=2)
    types.add(Withdrawn, name="account.withdrawn")
    types.add_upcaster("account.deposited", from_version=1,
                       upcaster=lambda d: {"amount": d["cents"]})
    return types


class Account(Aggregate):
    category = "account"

    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.owner = ""
        self.balance = 0
        self.movements = 0

    @classmethod
    def open(cls, id: str, owner: str) -> Account:
        account = cls(id)
        account.raise_event(Opened(owner=owner))
        return account

    def deposit(self, amount: int) -> None:
        if amount <= 0:
            raise ValueError("deposit a positive amount")
        self.raise_event(Deposited(amount=amount))

    def withdraw(self, amount: int) -> None:
        if amount > self.balance:
            raise InsufficientFunds(f"{self.id} holds {self.balance}, not {amount}")
        self.raise_event(Withdrawn(amount=amount))

    def rename(self, owner: str) -> None:
        self.raise_event(Renamed(owner=owner))

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

    @when(Renamed)
    def _renamed(self, event: Renamed) -> None:
        self.owner = event.owner
