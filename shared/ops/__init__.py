"""The ops function: the HTTP API and page through which ops and support act on onceflow."""
