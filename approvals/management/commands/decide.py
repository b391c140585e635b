"""Approve or reject a ticket from the command line, with the same rules as the console."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.decisions import decide
from approvals.decisions.errors import DecisionError, TicketNotFoundError
from approvals.models import Ticket


class Command(BaseCommand):
    help = "Decide a pending ticket: decide TICKET_ID --approve|--reject --user USERNAME"

    def add_arguments(self, parser) -> None:
        parser.add_argument("ticket_id", type=int)
        choice = parser.add_mutually_exclusive_group(required=True)
        choice.add_argument("--approve", action="store_true")
        choice.add_argument("--reject", action="store_true")
        parser.add_argument("--user", required=True, help="username of the person deciding")
        parser.add_argument("--message", default="", help="sent back to the model on rejection")
        parser.add_argument(
            "--always", action="store_true", help="also approve later calls of this tool in the run"
        )

    def handle(
        self, *args, ticket_id: int, approve: bool, user: str, message: str, always: bool, **options
    ) -> None:
        try:
            person = get_user_model().objects.get(username=user)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {user!r}") from None
        ticket = Ticket.objects.filter(pk=ticket_id).first()
        if ticket is None:
            raise CommandError(f"ticket {ticket_id} does not exist")
        try:
            ticket = decide.decide(
                ticket, user=person, approve=approve, message=message, always=always
            )
        except TicketNotFoundError:
            raise CommandError(f"ticket {ticket_id} does not exist for {user}") from None
        except DecisionError as error:
            # The page's sentence, word for word: one rule, one answer.
            raise CommandError(error.sentence()) from None
        run = ticket.run
        if ticket.is_pending:
            # An approval that counts towards a quorum the ticket has not reached yet.
            progress = decide.progress_of(ticket)
            self.stdout.write(
                f"ticket {ticket.pk} approval by {user} recorded ({progress.describe()}); "
                f"run {run.pk} is {run.status}"
            )
            return
        self.stdout.write(
            f"ticket {ticket.pk} {ticket.status} by {user}; run {run.pk} is {run.status}"
        )
