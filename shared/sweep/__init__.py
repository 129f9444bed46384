"""The sweep wing: duties the scheduled `sweep` runs besides the step repairs: retention,
and the backlog view of how far behind the machinery is."""
