"""The audit log: its hash chain, its vocabulary of actions, and the history people read."""
