"""The step engine: a run is a durable state machine journaled in `workflow_steps`.

`states` (the statuses and the one transition table), `journal` (creating step rows),
`outcomes` (classifying a result into the next state, backoff), `claim` and `settle` (one step
per `advance_step` invocation) and `repairs` (leases, wake-ups, lost dispatches: the sweep runs
them).
"""
