"""Thin entry points, one module per deployed function. Each parses its request or CloudEvent,
calls one function in `shared/`, and maps the outcome to a status. Nothing else lives here."""
