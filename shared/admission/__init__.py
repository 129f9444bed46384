"""Admission: one decision per (event, workflow) pairing (`admit`), and echo markers
(`echo`) that recognise the webhooks onceflow's own writes cause."""
