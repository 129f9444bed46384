"""The provider-neutral event shape (`event.py`); each provider's normalizer lives in its folder
under shared/providers/ and is reached through shared/providers/registry.py `normalize`."""

from __future__ import annotations

from shared.normalize.event import NormalizedEvent, UnparseableBody, snake

__all__ = ["NormalizedEvent", "UnparseableBody", "snake"]
