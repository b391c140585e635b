"""The models and the migrations agree: nothing is waiting to be generated."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_makemigrations_check_finds_no_changes():
    out = StringIO()

    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=StringIO())

    assert out.getvalue() == "No changes detected\n"
