"""A person's sessions page: each browser signed in as them, and signing the others out."""

from __future__ import annotations

import pytest
from allauth.usersessions.models import UserSession
from django.test import Client

from accounts.browsers import describe
from approvals.models import AuditEvent, Role
from tests.support import TenantFactory, member, signed_in

pytestmark = pytest.mark.django_db

URL = "/accounts/sessions/"
FIREFOX_ON_MAC = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.5; rv:131.0) Gecko/20100101 Firefox/131.0"
)
SAFARI_ON_IPHONE = (
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
    "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1"
)


def signed_out(client: Client) -> bool:
    response = client.get("/")
    return response.status_code == 302 and response["Location"].startswith("/login/")


def test_it_lists_each_session_with_its_browser_address_and_this_one():
    user = member(TenantFactory(), Role.APPROVER, username="ana")
    here = signed_in(user, ip="10.0.0.5")
    signed_in(user, user_agent=FIREFOX_ON_MAC, ip="192.0.2.7")

    response = here.get(URL)

    body = response.content.decode()
    assert response.status_code == 200
    assert body.count("<tr data-session=") == 2
    assert 'Chrome on Linux</span> <span class="badge">this session</span>' in body
    assert "Firefox on macOS</span></td>" in body
    assert "<code>10.0.0.5</code>" in body
    assert "<code>192.0.2.7</code>" in body
    assert body.count(">just now</time>") == 2


def test_it_signs_out_the_other_sessions_and_keeps_this_one():
    tenant, other = TenantFactory(), TenantFactory()
    user = member(tenant, Role.APPROVER, username="ana")
    member(other, Role.VIEWER, username="ana")
    bob = signed_in(member(tenant, Role.APPROVER, username="bob"))
    here, laptop = signed_in(user), signed_in(user, user_agent=FIREFOX_ON_MAC)

    response = here.post(URL, follow=True)

    assert response.redirect_chain == [(URL, 302)]
    assert "Signed out 1 other session." in response.content.decode()
    assert [signed_out(c) for c in (here, laptop, bob)] == [False, True, False]
    assert UserSession.objects.filter(user=user).count() == 1
    for t in (tenant, other):
        [event] = AuditEvent.objects.filter(tenant=t, action="auth.sessions_ended")
        assert (event.actor_name, event.detail["sessions"], event.detail["reason"]) == (
            "ana",
            1,
            "signed out the other sessions",
        )


def test_it_signs_out_one_session():
    user = member(TenantFactory(), Role.VIEWER)
    here = signed_in(user)
    phone = signed_in(user, user_agent=SAFARI_ON_IPHONE)
    laptop = signed_in(user, user_agent=FIREFOX_ON_MAC)
    phone_session = UserSession.objects.get(session_key=phone.session.session_key)

    response = here.post(URL, {"session": phone_session.pk})

    assert response.status_code == 302
    assert [signed_out(c) for c in (here, phone, laptop)] == [False, True, False]


def test_it_answers_404_for_another_persons_session_and_ends_nothing():
    tenant = TenantFactory()
    here = signed_in(member(tenant, Role.VIEWER))
    bob = signed_in(member(tenant, Role.VIEWER))
    bobs = UserSession.objects.get(session_key=bob.session.session_key)

    response = here.post(URL, {"session": bobs.pk})

    assert response.status_code == 404
    assert signed_out(bob) is False


def test_it_refuses_to_end_this_session_from_the_list():
    user = member(TenantFactory(), Role.VIEWER)
    here = signed_in(user)
    mine = UserSession.objects.get(session_key=here.session.session_key)

    assert here.post(URL, {"session": mine.pk}).status_code == 404
    assert signed_out(here) is False


def test_it_shows_a_form_error_page_for_a_bad_id_without_ending_anything():
    user = member(TenantFactory(), Role.VIEWER)
    here, other = signed_in(user), signed_in(user)

    response = here.post(URL, {"session": "nope"})

    assert response.status_code == 200
    assert signed_out(other) is False


def test_it_sends_the_signed_out_to_sign_in():
    response = Client().get(URL)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_me_page_links_to_the_sessions():
    here = signed_in(member(TenantFactory(), Role.VIEWER))

    assert f'href="{URL}" id="my-sessions"' in here.get("/me/").content.decode()


@pytest.mark.parametrize(
    ("agent", "words"),
    [
        (
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/131.0.0.0 Safari/537.36",
            "Chrome on Linux",
        ),
        (
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
            "Edge on Windows",
        ),
        (FIREFOX_ON_MAC, "Firefox on macOS"),
        (SAFARI_ON_IPHONE, "Safari on iOS"),
        (
            "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
            "Chrome/131.0.0.0 Mobile Safari/537.36",
            "Chrome on Android",
        ),
        ("curl/8.5.0", "curl"),
        ("", "Unknown browser"),
    ],
)
def test_describe_names_the_browser_and_system(agent, words):
    assert describe(agent) == words
