"""The client's address, for the API's failed-authentication count and django-axes alike.

``X-Forwarded-For`` is anyone's to write, so it is believed only as far as the proxies named in
``TAILTUNE_TRUSTED_PROXIES`` (addresses or CIDR networks) vouch for it: when the immediate peer
(``REMOTE_ADDR``) is one of them, the header is read from the right, skipping the trusted
proxies that appended to it, and the first address no trusted proxy added is the client. A
peer that is not trusted is the client, whatever the header says. Unset, no proxy is trusted.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Any

from django.conf import settings

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def trusted_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """The networks an entry list names (a bare address is a network of one); ValueError names a bad one."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
    return tuple(networks)


def _address(text: str) -> Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    return address


def client_ip(request: Any) -> str | None:
    """The address to count a request against (see the module's docstring); None when the peer
    has no IP address (a test client's bare request, a Unix socket)."""
    meta = request.META
    peer = _address(str(meta.get("REMOTE_ADDR") or ""))
    if peer is None:
        return None
    networks = trusted_networks(tuple(getattr(settings, "TAILTUNE_TRUSTED_PROXIES", ())))

    def trusted(address: Address) -> bool:
        return any(address in network for network in networks)

    client = peer
    if trusted(peer):
        hops = [hop for hop in str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if hop.strip()]
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                break  # a trusted proxy passed on garbage: the last address it vouched for stands
            client = address
            if not trusted(address):
                break
    return str(client)
