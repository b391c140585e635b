"""The console's pages, one module per page family: typed function views that validate with a
form, call one capability function, and render or redirect. Refusals are mapped in errors.py."""
