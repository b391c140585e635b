"""The accounts pages that are the console's own, by family: one's sessions, single sign-on."""
