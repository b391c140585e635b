"""The machinery a run executes with: its sealed state, its agent code, its conversation session,
the ledger of its effects and the resume queue."""
