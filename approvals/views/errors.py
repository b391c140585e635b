"""One place where a refused request becomes what a page answers: a domain error's sentence and
HTTP status (core.errors); 404 is raised, so another tenant's object reads as no object."""

from __future__ import annotations

from django.http import Http404

from approvals.core.errors import DomainError


def explain(error: DomainError) -> tuple[str, int]:
    """The sentence to show and the status to answer with. Raises Http404 for a 404."""
    if error.status == 404:
        raise Http404(error.sentence())
    return error.sentence(), error.status
