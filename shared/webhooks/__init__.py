"""Inbound webhooks: signature checks per provider (`signatures`), the receive path
(`receive`), and the after-commit fast-path nudge (`nudge`)."""
