"""Example transforms for the drain job (pass one as --transform pipelines.transforms:NAME).

A transform takes the message payload (a dict for json queues, str for text, bytes for binary) and
optionally the message itself (id, enqueued_at, due_at, attempts) as a second argument, and returns
anything JSON can hold: the drain job stores it as the JSON text of the output's `result` column.
An exception fails the message: `fail` records its text and the queue retries it or dead-letters it.
"""
from __future__ import annotations

from typing import Any, Mapping


class PoisonMessage(ValueError):
    """A payload the transform refuses every time: it ends in the dead-letter table."""


class TransientFailure(RuntimeError):
    """A failure that goes away on a later attempt (a timeout, a busy downstream)."""


def uppercase_name(payload: Mapping[str, Any]) -> dict[str, Any]:
    """{'name': 'ada', ...} -> {'name': 'ADA', ...}."""
    if not isinstance(payload, Mapping) or not isinstance(payload.get("name"), str):
        raise PoisonMessage(f"payload has no string field 'name': {str(payload)[:200]}")
    return {**payload, "name": payload["name"].upper()}


def uppercase_name_or_fail(payload: Mapping[str, Any], message: Mapping[str, Any]) -> dict[str, Any]:
    """uppercase_name, except: payloads with "poison": true fail on every attempt (-> dead letter);
    payloads with "flaky": true fail on their first attempt only (-> retried, then completed)."""
    if payload.get("poison"):
        raise PoisonMessage(f"poison payload {payload.get('id', '?')}")
    if payload.get("flaky") and int(message.get("attempts") or 1) <= 1:
        raise TransientFailure(f"flaky payload {payload.get('id', '?')}: first attempt fails")
    return uppercase_name(payload)
