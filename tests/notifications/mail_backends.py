"""An email backend for the tests: refuses chosen addresses, or all when the server is "down"."""

from __future__ import annotations

import smtplib

from django.core.mail.backends.locmem import EmailBackend


class RefusingBackend(EmailBackend):
    """Like locmem, but a message to an address in `refused` raises as an SMTP server would."""

    refused: set[str] = set()
    down: bool = False
    # When set, opening the connection fails (an unreachable SMTP server) before any message.
    unreachable: bool = False
    opened: int = 0

    def open(self):
        type(self).opened += 1
        if self.unreachable:
            raise ConnectionRefusedError(111, "Connection refused")
        return super().open()

    def send_messages(self, messages):
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")
        for message in messages:
            bad = [to for to in message.recipients() if to in self.refused]
            if bad:
                raise smtplib.SMTPRecipientsRefused(
                    {to: (550, f"5.1.1 <{to}>: mailbox unavailable".encode()) for to in bad}
                )
        return super().send_messages(messages)
