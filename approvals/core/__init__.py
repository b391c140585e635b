"""Core helpers every capability uses: canonical JSON, crypto, redaction, pagination, errors."""
