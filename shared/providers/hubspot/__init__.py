"""HubSpot: everything onceflow knows about it (shared/providers/registry.py lists it)."""
