"""Approval policies: which version governs a call, its quorum and rules, and how admins change them."""
