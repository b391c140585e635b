"""row_url: the list pages' links to each row's page, as {% url %} writes them."""

from __future__ import annotations

import pytest
from django.template import Context, Template
from django.test import override_settings
from django.urls import NoReverseMatch, clear_script_prefix, set_script_prefix, set_urlconf

from approvals.templatetags import approvals as tags

NAMES = ("approvals:ticket", "approvals:run", "approvals:ticket-record")


def _both(name: str, pk) -> tuple[str, str]:
    context = Context({"pk": pk, "name": name})
    return (
        Template("{% load approvals %}{% row_url name pk %}").render(context),
        Template("{% url name pk %}").render(context),
    )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("pk", [0, 7, 1234567, 2**53 + 1, 2**62])
def test_a_row_url_is_the_url_tags(name, pk):
    fast, reversed_ = _both(name, pk)
    assert fast == reversed_
    assert str(pk) in fast


def test_a_row_url_follows_the_script_prefix():
    tags._row_paths.clear()
    assert _both("approvals:ticket", 5)[0] == "/tickets/5/"
    set_script_prefix("/console/")
    try:
        fast, reversed_ = _both("approvals:ticket", 5)
    finally:
        clear_script_prefix()
    assert fast == reversed_ == "/console/tickets/5/"
    assert _both("approvals:ticket", 5)[0] == "/tickets/5/"


def test_a_row_url_follows_the_url_configuration():
    tags._row_paths.clear()
    assert _both("approvals:ticket", 5)[0] == "/tickets/5/"
    with override_settings(ROOT_URLCONF="tests.approvals.views.prefixed_urls"):
        fast, reversed_ = _both("approvals:ticket", 5)
        assert fast == reversed_ == "/under/tickets/5/"
    assert _both("approvals:ticket", 5)[0] == "/tickets/5/"
    # A request's own URL configuration (request.urlconf), as the handler sets it.
    set_urlconf("tests.approvals.views.prefixed_urls")
    try:
        fast, reversed_ = _both("approvals:ticket", 5)
    finally:
        set_urlconf(None)
    assert fast == reversed_ == "/under/tickets/5/"
    assert _both("approvals:ticket", 5)[0] == "/tickets/5/"


def test_a_row_url_of_what_is_not_an_id_is_reversed_as_given():
    # A string id goes through reverse() itself; what no URL takes is refused as {% url %} is.
    assert _both("approvals:ticket", "12") == ("/tickets/12/", "/tickets/12/")
    for wrong in (True, -3, "x"):
        with pytest.raises(NoReverseMatch):
            Template("{% load approvals %}{% row_url 'approvals:ticket' pk %}").render(
                Context({"pk": wrong})
            )
