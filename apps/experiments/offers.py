"""What the hosts able to run an experiment offer its spec: the switch commands and routers the
operator named on each host (``TAILTUNE_SWITCH_COMMANDS``, ``TAILTUNE_ROUTERS``; registered by
apps/runs/hosts.host_register_local).

A spec's ``recovery.switch`` and ``recovery.router`` are names, never a program or an address;
:func:`spec_offer_errors` refuses a name that no qualifying host offers, with a field error, for
every path that creates an experiment (the page, the API, ``experiment_import``: all go through
apps/experiments/services.experiment_create). The page and the API list the names
(:func:`offers_for`) and never the commands or URLs behind them.

A qualifying host is an enabled host of the experiment's hardware (any hardware for an
experiment not yet pinned: it is pinned to its first host's when it starts) that serves its
``max_model_len`` (apps/runs/scheduling.why_not). The rehearsal runs on one host, so the switch
and the router must be offered by the same host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q, QuerySet

from apps.experiments.spec_checker import FieldError
from apps.runs.models import Host


@dataclass(frozen=True)
class HostOffer:
    """One host's names (sorted): what a spec may pick when this host runs its rehearsal."""

    host: str
    switches: tuple[str, ...]
    routers: tuple[str, ...]


@dataclass(frozen=True)
class Offers:
    hosts: tuple[HostOffer, ...] = field(default_factory=tuple)

    @property
    def switches(self) -> list[str]:
        return sorted({name for h in self.hosts for name in h.switches})

    @property
    def routers(self) -> list[str]:
        return sorted({name for h in self.hosts for name in h.routers})

    def as_json(self) -> dict[str, Any]:
        return {
            "switches": self.switches,
            "routers": self.routers,
            "hosts": [
                {"name": h.host, "switches": list(h.switches), "routers": list(h.routers)} for h in self.hosts
            ],
        }


def hosts_able(*, max_model_len: int | None = None, hardware_id: str = "") -> QuerySet[Host]:
    """The enabled hosts that may run an experiment of this context length and hardware."""
    hosts = Host.objects.filter(enabled=True)
    if max_model_len:
        hosts = hosts.filter(Q(max_model_len__isnull=True) | Q(max_model_len__gte=max_model_len))
    if hardware_id:
        hosts = hosts.filter(hardware_id=hardware_id)
    return hosts.order_by("name")


def _names(value: Any) -> tuple[str, ...]:
    return tuple(sorted(str(k) for k in value)) if isinstance(value, Mapping) else ()


def offers_for(*, max_model_len: int | None = None, hardware_id: str = "") -> Offers:
    """The switch and router names the hosts able to run such an experiment offer, per host."""
    rows = hosts_able(max_model_len=max_model_len, hardware_id=hardware_id).values_list(
        "name", "switches", "routers"
    )
    return Offers(
        tuple(HostOffer(name, _names(switches), _names(routers)) for name, switches, routers in rows)
    )


def spec_offers(spec: Mapping[str, Any], *, hardware_id: str = "") -> Offers:
    """What the hosts able to run a validated spec offer it."""
    controls = spec.get("controls") or {}
    return offers_for(max_model_len=controls.get("max_model_len"), hardware_id=hardware_id)


def spec_offer_errors(spec: Mapping[str, Any], *, hardware_id: str = "") -> list[FieldError]:
    """Field errors for a validated spec's ``recovery.switch`` / ``recovery.router`` that no
    qualifying host offers (both must be offered by one host); [] when it names none."""
    recovery = spec.get("recovery") or {}
    switch, router = recovery.get("switch"), recovery.get("router")
    if switch is None and router is None:
        return []
    offers = spec_offers(spec, hardware_id=hardware_id)
    errors: list[FieldError] = []
    for key, name, offered, setting in (
        ("switch", switch, offers.switches, "TAILTUNE_SWITCH_COMMANDS"),
        ("router", router, offers.routers, "TAILTUNE_ROUTERS"),
    ):
        if name is not None and name not in offered:
            listed = ", ".join(offered) or "none"
            errors.append(
                FieldError(
                    f"recovery.{key}",
                    f"no host able to run this experiment offers {key} {name!r} (they offer: {listed}); "
                    f"the operator names them in the host's {setting}",
                )
            )
    if not errors and switch is not None and router is not None:
        if not any(switch in h.switches and router in h.routers for h in offers.hosts):
            errors.append(
                FieldError(
                    "recovery.router",
                    f"no one host offers both switch {switch!r} and router {router!r}: "
                    "the rehearsal runs on one host",
                )
            )
    return errors


def spec_bind_errors(spec: Mapping[str, Any], *, hardware_id: str = "") -> list[FieldError]:
    """A field error when the spec's reused servers need their prefix cache reset (``engine.reuse``
    and ``controls.enable_prefix_caching``: vLLM's development endpoints, only ever on behind a
    loopback bind, workers/engine/launcher.py) and every host able to run it binds beyond
    loopback; [] otherwise, and when no host is registered yet (the start and the worker check
    again, docs/ENGINE.md "Development endpoints")."""
    from workers.engine.launcher import is_loopback

    engine, controls = spec.get("engine") or {}, spec.get("controls") or {}
    if not (engine.get("reuse", True) and controls.get("enable_prefix_caching")):
        return []
    binds = list(
        hosts_able(max_model_len=controls.get("max_model_len"), hardware_id=hardware_id).values_list(
            "name", "bind_host"
        )
    )
    if not binds or any(is_loopback(bind) for _, bind in binds):
        return []
    listed = ", ".join(f"{name} binds {bind}" for name, bind in binds)
    return [
        FieldError(
            "controls.enable_prefix_caching",
            "with engine.reuse on, a reused server's prefix cache is reset through vLLM's development "
            "endpoints, which are only turned on for a server bound to loopback, and no host able to "
            f"run this experiment binds one ({listed}); turn engine.reuse or prefix caching off, or "
            "have the operator set TAILTUNE_BIND_HOST=127.0.0.1 on a host",
        )
    ]
