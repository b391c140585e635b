"""A run's life: paused by the agent's code, resumed by the worker, reaped when its worker dies,
resolved by a person when an effect is in doubt."""
