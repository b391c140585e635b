"""Edit and approve: the call's arguments in a form checked against the tool's schema."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from approvals.core import presenters
from approvals.core.errors import DomainError
from approvals.decisions import baseline, edit
from approvals.decisions.errors import InvalidArgumentsError
from approvals.forms.edit import ARG_PREFIX, EditArgumentsForm
from approvals.views import access, errors


@login_required
@require_http_methods(["GET", "POST"])
def ticket_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Edit and approve: the arguments in a form checked against the tool's JSON schema."""
    ticket, membership = access.get_ticket_for_user(request, pk)
    context: dict = {"ticket": ticket, "run": ticket.run, "membership": membership}
    try:
        tool = edit.check_editable(ticket, request.user)
    except DomainError as error:
        context["refusal"], status = errors.explain(error)
        return render(request, "approvals/edit.html", context, status=status)
    original = json.loads(ticket.arguments_json)
    form = EditArgumentsForm(
        request.POST if request.method == "POST" else None,
        schema=tool.params_json_schema,
        original=original if isinstance(original, dict) else {},
    )
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid() and form.arguments is not None:
            try:
                edit.edit_and_approve(
                    ticket,
                    user=request.user,
                    arguments=form.arguments,
                    message=form.cleaned_data["message"],
                )
            except InvalidArgumentsError as error:
                for problem in error.problems:
                    field = ARG_PREFIX + str(problem.argument)
                    form.add_error(field if field in form.fields else None, problem.message)
            except DomainError as error:
                context["problem"], status = errors.explain(error)
            else:
                messages.success(
                    request,
                    f"Ticket #{ticket.pk} rejected with your corrected arguments, which are "
                    "pre-authorised: when the agent calls again with exactly those, the call "
                    "runs without asking again.",
                )
                return redirect("approvals:run", pk=ticket.run_id)
        if form.arguments is not None:
            context["changes"] = presenters.diff(original, form.arguments)
    compared = baseline.baseline_for(ticket=ticket, arguments=original)
    context.update(
        {
            "baseline": compared,
            "target_names": baseline.target_arguments(
                agent_key=ticket.run.agent_key,
                agent_version=ticket.run.agent_version,
                tool_name=ticket.tool_name,
                arguments=original,
            ),
            "form": form,
            "tool": tool,
            "arguments": presenters.arguments_rows_from_json(ticket.arguments_json),
        }
    )
    return render(request, "approvals/edit.html", context, status=status)
