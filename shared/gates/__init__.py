"""Gates: what the step executor checks around a block's side effect (`catalog`), and the
rules behind them: rate limits (`throttle`), budgets, credits and the breaker."""
