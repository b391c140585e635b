from __future__ import annotations

from django import forms

from notifications.models import DeliveryStatus, Event
from notifications.targets import WebhookURLError, check_url


class EndpointForm(forms.Form):
    url = forms.URLField(
        label="URL", max_length=500, assume_scheme="https", help_text="http:// or https://"
    )
    description = forms.CharField(max_length=200, required=False)
    events = forms.MultipleChoiceField(
        choices=Event.choices, widget=forms.CheckboxSelectMultiple, required=True
    )
    active = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args, saved_url: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.saved_url = saved_url

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        try:
            return check_url(url, saved=self.saved_url)
        except WebhookURLError as error:
            raise forms.ValidationError(str(error)) from None


class DeliveryFilterForm(forms.Form):
    endpoint = forms.IntegerField(required=False, min_value=1)
    status = forms.CharField(required=False, max_length=16)
    after = forms.CharField(required=False, max_length=200)

    def __init__(self, *args, endpoint_ids: set[int], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.endpoint_ids = endpoint_ids

    def clean_endpoint(self) -> int | None:
        value = self.cleaned_data["endpoint"]
        if value is not None and value not in self.endpoint_ids:
            raise forms.ValidationError("There is no such webhook in this tenant.")
        return value

    def clean_status(self) -> str:
        value = self.cleaned_data["status"]
        if value and value not in DeliveryStatus.values:
            raise forms.ValidationError("Choose pending, delivered or failed.")
        return value


class EmailFilterForm(forms.Form):
    status = forms.CharField(required=False, max_length=16)
    after = forms.CharField(required=False, max_length=200)

    def clean_status(self) -> str:
        value = self.cleaned_data["status"]
        if value and value not in DeliveryStatus.values:
            raise forms.ValidationError("Choose pending, delivered or failed.")
        return value
