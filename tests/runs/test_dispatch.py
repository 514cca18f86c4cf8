"""The services send the workers' tasks by name (apps/runs/dispatch.py): the names are the tasks'."""

from __future__ import annotations

import pytest

from apps.runs import dispatch


def test_every_name_the_services_send_is_a_task_the_workers_register():
    import workers.tasks  # noqa: F401  (registers the tasks with the app)
    from config import celery_app

    assert set(dispatch.TASKS) <= set(celery_app.tasks), set(dispatch.TASKS) - set(celery_app.tasks)


def test_an_unknown_task_name_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="unknown task"):
        dispatch.send_on_commit("tailtune.no_such_task", kwargs={}, queue="q")
