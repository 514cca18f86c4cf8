"""vLLM's development endpoints (VLLM_SERVER_DEV_MODE: /reset_prefix_cache, /sleep, /collective_rpc)
are only ever on for a server bound to loopback: a host binding another address neither qualifies
for nor claims an experiment whose reused servers need the prefix-cache reset, the start says why,
and the worker refuses to start such a server (docs/ENGINE.md, "Development endpoints")."""

from __future__ import annotations

from typing import Any

import pytest

from apps.experiments.models import Experiment
from apps.experiments.spec import SpecError
from apps.lifecycle.running import StartError, experiment_start
from apps.runs.dispatch import HOST_PULL
from apps.runs.scheduling import hosts_by_qualification, run_claim_next, runs_dispatch, why_not
from tests.dispatch_support import hold_tasks
from tests.experiments.factories import make_experiment, small_spec
from tests.runs.factories import make_host
from workers.engine.launcher import LaunchError, build_launch
from workers.pipeline import host_config

pytestmark = pytest.mark.django_db

CPU = "1x test CPU"


def _experiment(*, prefix_caching: bool, reuse: bool = True, running: bool = False) -> Experiment:
    controls = {**small_spec()["controls"], "enable_prefix_caching": prefix_caching}
    experiment = make_experiment(controls=controls, engine={"reuse": reuse})
    if running:
        Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING, hardware_id=CPU)
        experiment.refresh_from_db()
        experiment.runs.update(trace_sha256="a" * 64)
        runs_dispatch(list(experiment.runs.all()), experiment)
    return experiment


def test_a_host_binding_beyond_loopback_does_not_qualify_when_the_reset_needs_dev_mode() -> None:
    exposed = make_host("exposed", hardware_id=CPU, bind_host="0.0.0.0")
    local = make_host("local", hardware_id=CPU, bind_host="127.0.0.1")
    needs_reset = _experiment(prefix_caching=True)
    reason = why_not(exposed, needs_reset)
    assert reason is not None and "binds 0.0.0.0" in reason and "loopback" in reason
    assert why_not(local, needs_reset) is None
    # No reset, no development mode: any bind serves.
    assert why_not(exposed, _experiment(prefix_caching=False)) is None
    assert why_not(exposed, _experiment(prefix_caching=True, reuse=False)) is None
    ok, not_ok = hosts_by_qualification(needs_reset)
    assert [h.name for h in ok] == ["local"] and [(h.name, r) for h, r in not_ok] == [("exposed", reason)]


def test_the_start_says_why_when_only_such_hosts_are_alive(monkeypatch: Any) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    experiment = _experiment(prefix_caching=True)  # created before any host registered
    make_host("exposed", hardware_id=CPU, bind_host="10.0.0.7")
    with pytest.raises(StartError) as refused:
        experiment_start(experiment=experiment)
    assert "exposed" in str(refused.value) and "binds 10.0.0.7" in str(refused.value)
    assert Experiment.objects.get(pk=experiment.pk).status == Experiment.Status.PLANNED


def test_such_a_host_claims_none_of_its_runs_and_a_loopback_host_does(monkeypatch: Any) -> None:
    hold_tasks(monkeypatch, HOST_PULL)
    _experiment(prefix_caching=True, running=True)
    assert run_claim_next(host=make_host("exposed", hardware_id=CPU, bind_host="0.0.0.0")) is None
    assert run_claim_next(host=make_host("local", hardware_id=CPU, bind_host="::1")) is not None


def test_the_worker_refuses_to_start_a_dev_mode_server_on_such_a_host(settings: Any) -> None:
    exposed = make_host("exposed", hardware_id=CPU, bind_host="0.0.0.0")
    config = host_config(exposed, dev_mode=True)
    with pytest.raises(LaunchError) as refused:
        build_launch(
            model=str(settings.ENGINE_DIR / "models" / "tiny-llama"), cell_args={}, controls={},
            host=config, port=8000, base_env={},
        )  # fmt: skip
    assert refused.value.name == "bind_host" and "loopback" in str(refused.value)
    local = host_config(make_host("local", bind_host="127.0.0.1"), dev_mode=True)
    plan = build_launch(
        model=str(settings.ENGINE_DIR / "models" / "tiny-llama"), cell_args={}, controls={},
        host=local, port=8000, base_env={},
    )  # fmt: skip
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_the_worker_checks_the_model_against_its_own_roots(settings: Any, tmp_path: Any) -> None:
    settings.TAILTUNE_MODEL_ROOTS = [str(tmp_path / "models")]
    config = host_config(make_host("local", model_roots=["/"]))  # the row is not what the worker trusts
    with pytest.raises(LaunchError) as refused:
        build_launch(model="/etc", cell_args={}, controls={}, host=config, port=8000, base_env={})
    assert refused.value.name == "model" and str(tmp_path / "models") in str(refused.value)


def test_a_spec_needing_the_reset_is_refused_when_every_host_able_binds_beyond_loopback() -> None:
    needs_reset = {"controls": {**small_spec()["controls"], "enable_prefix_caching": True}}
    assert make_experiment(**needs_reset).pk  # no host known yet: the start and the worker decide
    make_host("exposed", hardware_id=CPU, bind_host="0.0.0.0")
    before = Experiment.objects.count()
    with pytest.raises(SpecError) as refused:
        make_experiment(**needs_reset)
    [error] = refused.value.errors
    assert error.path == "controls.enable_prefix_caching" and "exposed binds 0.0.0.0" in error.message
    assert "loopback" in error.message and Experiment.objects.count() == before
    assert make_experiment(**needs_reset, engine={"reuse": False}).pk  # no reuse, no reset
    make_host("local", hardware_id=CPU, bind_host="127.0.0.1")
    assert make_experiment(**needs_reset).pk
