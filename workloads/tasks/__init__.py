"""Demo data sets (digits, breast-cancer) for `python -m workloads.data partition`."""

from __future__ import annotations

from workloads.tasks.common import Task


def get_task(name: str) -> Task:
    """Return the task called ``name`` ("digits" or "breast-cancer")."""
    if name == "digits":
        from workloads.tasks import digits

        return digits.TASK
    if name in ("breast-cancer", "breast_cancer"):
        from workloads.tasks import breast_cancer

        return breast_cancer.TASK
    raise ValueError(f"unknown task {name!r}: expected 'digits' or 'breast-cancer'")


TASK_NAMES: tuple[str, ...] = ("digits", "breast-cancer")

__all__ = ["TASK_NAMES", "Task", "get_task"]
