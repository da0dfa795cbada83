"""The aggregate tests' domain: the bank of ``examples/bank`` (accounts with deposits and
withdrawals; ``Deposited`` has a version 1 that called the amount ``cents``), plus an account
that raises an event no registry knows."""

from __future__ import annotations

from pydantic import BaseModel

from examples.bank.domain import Account, Deposited, InsufficientFunds, registry as bank_registry
from lakefold.eventstore import when
from lakefold.schemas import EventRegistry

__all__ = ["Account", "Deposited", "InsufficientFunds", "RenamableAccount", "registry"]


class Renamed(BaseModel):  # registered in no registry: saving it is refused
    owner: str


class RenamableAccount(Account):
    def rename(self, owner: str) -> None:
        self.raise_event(Renamed(owner=owner))

    @when(Renamed)
    def _renamed(self, event: Renamed) -> None:
        self.owner = event.owner


def registry() -> EventRegistry:
    return bank_registry
