"""The accounts pages that are the console's own: the list of one's sessions (allauth records
them at sign-in; approvals.signins ends them, audited, with their live sockets)."""

from __future__ import annotations

from allauth.usersessions.models import UserSession
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from accounts.browsers import describe
from accounts.forms import EndSessionsForm
from approvals import signins

OTHERS_REASON = "signed out the other sessions"
ONE_REASON = "signed out a session"


def _sessions_of(request: HttpRequest) -> list[UserSession]:
    # purge_and_list drops the records of sessions that expired or were signed out.
    return sorted(
        UserSession.objects.purge_and_list(request.user),
        key=lambda s: (s.session_key != request.session.session_key, -s.created_at.timestamp()),
    )


def _end(request: HttpRequest, form: EndSessionsForm) -> int:
    current = request.session.session_key
    session_id = form.cleaned_data["session"]
    if session_id is None:
        return signins.end_sessions(
            user=request.user, keep_session_key=current, reason=OTHERS_REASON, actor=request.user
        )
    session = UserSession.objects.filter(pk=session_id, user_id=request.user.pk).first()
    # Another person's session, or one already gone, is not in this person's list.
    if session is None or session.session_key == current:
        raise Http404("no such session of yours")
    return signins.end_sessions(
        user=request.user,
        only_session_keys=[session.session_key],
        reason=ONE_REASON,
        actor=request.user,
    )


@never_cache
@login_required
@require_http_methods(["GET", "POST"])
def sessions(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = EndSessionsForm(request.POST)
        if form.is_valid():
            ended = _end(request, form)
            messages.success(
                request,
                f"Signed out {ended} other session{'s' if ended != 1 else ''}."
                if ended
                else "No other session was signed in.",
            )
            return redirect("usersessions_list")
    else:
        form = EndSessionsForm()
    current = request.session.session_key
    rows = [(s, describe(s.user_agent), s.session_key == current) for s in _sessions_of(request)]
    return render(
        request,
        "usersessions/usersession_list.html",
        {"rows": rows, "others": sum(1 for _, _, here in rows if not here), "form": form},
    )
