"""Deciding and working on tickets: a decision, a claim, a comment, a batch; resolving a run;
switching tenant."""

from __future__ import annotations

from django import forms

from approvals.decisions.batch import MAX_BATCH
from approvals.decisions.comments import MAX_COMMENT_CHARS
from approvals.decisions.decide import MAX_MESSAGE_CHARS


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    message = forms.CharField(
        required=False,
        max_length=MAX_MESSAGE_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Sent back to the model when you reject.",
    )
    always = forms.BooleanField(required=False)
    # Set by the ticket page when it showed the call's flags (decisions.calls): a flagged call
    # is approved only by someone who was shown them.
    flags_seen = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        if data.get("always") and data.get("decision") == "reject":
            raise forms.ValidationError("'Always approve' goes with an approval, not a rejection.")
        return data


class ResolveForm(forms.Form):
    resolution = forms.ChoiceField(
        choices=[
            ("happened", "The effect happened: record it and let the run finish"),
            ("retry", "The effect did not happen: run it again"),
            ("abandon", "Stop the run here"),
        ]
    )
    note = forms.CharField(
        required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 2})
    )


class TenantSwitchForm(forms.Form):
    tenant = forms.CharField(required=False, max_length=64)
    next = forms.CharField(required=False, max_length=500)


class ClaimForm(forms.Form):
    action = forms.ChoiceField(
        choices=[("claim", "I'm on it"), ("take_over", "Take over"), ("release", "Release")]
    )


class CommentForm(forms.Form):
    text = forms.CharField(
        max_length=MAX_COMMENT_CHARS,
        widget=forms.Textarea(attrs={"rows": 3}),
        error_messages={"required": "Write something first."},
    )


class _TicketIds(forms.Field):
    """Ticket numbers, from repeated "ticket" fields (the queue's checkboxes)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> list[int]:
        values = value if isinstance(value, list | tuple) else [value] if value else []
        if len(values) > MAX_BATCH:
            raise forms.ValidationError(
                f"A batch holds at most {MAX_BATCH} tickets; {len(values)} were selected."
            )
        ids = []
        for item in values:
            text = str(item).strip()
            if not text.isascii() or not text.isdigit() or len(text) > 18:
                raise forms.ValidationError(f"{text[:20]!r} is not a ticket number.")
            ids.append(int(text))
        return list(dict.fromkeys(ids))


class BatchDecisionForm(forms.Form):
    ticket = _TicketIds(required=False)
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    message = forms.CharField(required=False, max_length=MAX_MESSAGE_CHARS)

    def clean_ticket(self) -> list[int]:
        if not self.cleaned_data["ticket"]:
            raise forms.ValidationError("Select at least one ticket.")
        return self.cleaned_data["ticket"]
