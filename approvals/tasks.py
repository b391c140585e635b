"""Background tasks: thin wrappers that take primitive ids and call a service."""

from __future__ import annotations

from django_tasks import task


@task()
def resume_run_task(run_id: int) -> str:
    from approvals import services

    return services.resume(run_id=run_id).status
