"""Gates: what the step executor checks around a block's side effect — one module per gate
(`connection_limit`, `workflow_limit`, `host_limit`, `reservation`, `charge`, each shaped by
`kind`), listed in order in `catalog` — and the rules behind them: rate limits (`throttle`),
budgets, credits; and the breaker, which pauses a workflow at admission."""
