"""Ingest: webhooks verified at the door (`receive`, `signatures`), the inbox that types
them, shadow records, pre-admission drops, the outbox that publishes trigger events, and the
echo markers (`echo`) that say which incoming change is onceflow's own write coming back:
written by the CRM blocks and polls before they write, read by admission and by waits."""
