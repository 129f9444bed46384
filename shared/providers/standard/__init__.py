"""Standard Webhooks senders (shared/providers/registry.py lists it)."""
