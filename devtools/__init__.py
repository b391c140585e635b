"""Test, benchmark and demo tooling: installed outside production only (config/settings.py)."""
