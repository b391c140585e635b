"""The console's forms, one module per page family."""
