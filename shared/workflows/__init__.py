"""Workflow definitions: the format customers write, validation, versions and bindings."""
