"""Factories for experiments: a small valid spec, and experiments built from it."""

from __future__ import annotations

import copy
from typing import Any

import factory
from django.contrib.auth import get_user_model

from apps.lifecycle.creation import experiment_create

SMALL_SPEC: dict[str, Any] = {
    "name": "small",
    "description": "",
    "owner": "",
    "model": {
        "path": ".engine/models/tiny-llama",
        "revision": "tiny-llama-local-v1",
        "tokenizer_revision": "tiny-llama-local-v1",
    },
    "controls": {"dtype": "bfloat16", "max_model_len": 2048, "kv_cache_memory_bytes": 33554432},
    "baseline": {
        "id": "B0",
        "captured_from": "prod",
        "args": {"max_num_batched_tokens": 2048, "max_num_seqs": 8},
    },
    "candidates": [{"id": "C1", "args": {"max_num_batched_tokens": 512, "max_num_seqs": 8}}],
    "classes": [
        {
            "name": "short",
            "input_tokens": 64,
            "output_tokens": 8,
            "contract": {"ttft_p99_ms": 2000, "e2e_p99_ms": 5000, "max_stall_ms": 1000, "error_rate": 0.05},
        },
        {
            "name": "long",
            "input_tokens": 1024,
            "output_tokens": 8,
            # 0: the cells schedule fcfs (vLLM's default), where vLLM refuses another priority.
            "priority": 0,
            "contract": {"ttft_p99_ms": 8000, "e2e_p99_ms": 12000, "max_stall_ms": 4000, "error_rate": 0.05},
        },
    ],
    "workload": {
        "mixtures": {"80-20": {"short": 0.8, "long": 0.2}},
        "rates": {"low": 1.0},
        "arrival": {"process": "poisson"},
        "repeats": 1,
        "seed": 7,
        "warmup_s": 2,
        "observation_s": 10,
        "drain_deadline_s": 20,
        "max_dispatch_lag_ms": 50,
    },
}


def small_spec(**overrides: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMALL_SPEC)
    spec.update(overrides)
    return spec


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-test-123")

    @factory.post_generation
    def roles(self, create: bool, extracted: list[str] | None, **kwargs: Any) -> None:
        if create and extracted:
            from django.contrib.auth.models import Group

            self.groups.add(*Group.objects.filter(name__in=extracted))


def make_experiment(owner: Any = None, **overrides: Any):  # type: ignore[no-untyped-def]
    owner = owner or UserFactory(roles=["experimenter"])
    return experiment_create(spec=small_spec(**overrides), owner=owner)
