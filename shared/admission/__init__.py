"""Admission: one decision per (event, workflow) pairing (`admit`). The echo markers it reads
to recognise the webhooks onceflow's own writes cause live in `shared.ingest.echo`, below the
blocks and polls that write them."""
