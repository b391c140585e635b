"""The webhook address guard (SSRF): which URLs and addresses a webhook may go to.

check_url runs when an endpoint is saved; the webhook POST asks again at send time through
target, addresses_of and refusal_for, as a name's addresses may change. Nothing here sends.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from django.conf import settings

logger = logging.getLogger(__name__)


class WebhookURLError(ValueError):
    pass


IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Not covered by is_private in Python 3.11: carrier-grade NAT, often the cloud's own network.
_SHARED = ipaddress.ip_network("100.64.0.0/10")
# IPv6 prefixes that carry an IPv4 address a gateway may forward to: NAT64 and the deprecated
# IPv4-compatible form (IPv4-mapped and 6to4 have properties of their own; Teredo, 2001::/32,
# is refused as private).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    if ip.version != 6:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def blocked_reason(ip: IPAddress) -> str:
    """Why a webhook may not go to this address ("a loopback address"), or "" when it may."""
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        # The IPv4 address is where the packets go (::ffff:8.8.8.8 is as public as 8.8.8.8).
        return blocked_reason(embedded)
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_multicast:
        return "a multicast address"
    if ip in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private or not ip.is_global or (ip.version == 6 and ip.is_site_local):
        return "a private address"
    return ""


def _resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses a host name resolves to, in the resolver's order (tests replace this)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # A scoped IPv6 address comes back as "fe80::1%eth0"; its scope does not change its range.
    found = [ipaddress.ip_address(info[4][0].partition("%")[0]) for info in infos]
    return list(dict.fromkeys(found))


class Unresolvable(OSError):
    def __init__(self, host: str, detail: str = "") -> None:
        super().__init__(f"{host} does not resolve" + (f" ({detail})" if detail else ""))


def addresses_of(host: str, port: int) -> tuple[list[IPAddress], bool]:
    """(addresses, whether host is an address literal). Raises Unresolvable."""
    try:
        return [ipaddress.ip_address(host)], True
    except ValueError:
        pass
    try:
        found = _resolve(host, port)
    except (OSError, UnicodeError) as error:
        raise Unresolvable(host, str(error)) from None
    if not found:
        raise Unresolvable(host)
    return found, False


def refusal_for(host: str, addresses: list[IPAddress], literal: bool) -> str:
    """Why the addresses of host are refused ("" when private targets are allowed or none is)."""
    if settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS:
        return ""
    for ip in addresses:
        reason = blocked_reason(ip)
        if reason:
            if literal:
                return f"{host} is {reason}"
            # Not the address itself: the message reaches tenant admins, who must not learn
            # the internal network's names and addresses from it. The log has it.
            logger.info("webhook host %s resolves to %s, %s", host, ip, reason)
            return f"{host} resolves to {reason}"
    return ""


def _check_form(url: str):
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookURLError("Enter an http:// or https:// URL with a host name.")
    if parts.username or parts.password:
        raise WebhookURLError("Put credentials in the signature secret, not in the URL.")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        raise WebhookURLError("Enter a port between 1 and 65535.") from None
    return parts


def target(url: str) -> tuple[str, int]:
    """(host, port) of a well-formed webhook URL; raises WebhookURLError otherwise."""
    parts = _check_form(url)
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


PUBLIC_ONLY = "webhooks may only go to public addresses"


def check_url(url: str, *, saved: str = "") -> str:
    """Only absolute http(s) URLs with a host; anything else never leaves the console.

    Unless NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS, the host must also be public: an address in a
    private, loopback, link-local or other non-public range is refused, and so is a name that
    resolves to one (any of its addresses) or that does not resolve. post() checks again at
    send time, as a name's addresses may change. The URL an endpoint already has (`saved`) is
    not looked up again: its description, events and active flag can always be changed (an
    admin must be able to switch off a webhook that the guard, or a DNS outage, now refuses).
    """
    host, port = target(url)
    if settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS or (saved and url == saved):
        return url
    try:
        addresses, literal = addresses_of(host, port)
    except Unresolvable:
        raise WebhookURLError(
            f"{host} does not resolve; {PUBLIC_ONLY}, so the name must resolve to check it."
        ) from None
    refusal = refusal_for(host, addresses, literal)
    if refusal:
        raise WebhookURLError(f"{refusal}; {PUBLIC_ONLY}.")
    return url
