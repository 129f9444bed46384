"""Ingest: webhooks verified at the door (`receive`, `signatures`), the inbox that types
them, shadow records, pre-admission drops, and the outbox that publishes trigger events."""
