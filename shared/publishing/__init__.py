"""Publishing a definition: validation against the catalogs, immutable versions and
bindings, the provider subscriptions active workflows need, and the editor's JSON Schema.
Sits above the catalogs (blocks, triggers, gates) it judges a definition against."""
