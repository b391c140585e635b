"""Deciding tickets: by a person, by a policy's rules, on expiry, in a batch; and working on them as a team."""
