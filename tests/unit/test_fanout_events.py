"""What the hub logs per event: the wake-up handlers' success lines are not logged."""

from __future__ import annotations

import io
import logging

import kopf

from hub_controller.operator import handlers


def _log_through_filter(*messages: tuple[int, str]) -> str:
    logger = logging.getLogger("test.quiet")
    logger.propagate = False
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    handlers.quiet_event_handlers(logger)
    handlers.quiet_event_handlers(logger)  # installed once only
    try:
        assert sum(isinstance(f, handlers.QuietEventHandlers) for f in logger.filters) == 1
        for level, msg in messages:
            logger.log(level, msg)
    finally:
        logger.removeHandler(handler)
        for f in list(logger.filters):
            logger.removeFilter(f)
    return out.getvalue()


def test_quiet_filter_drops_only_wakeup_successes() -> None:
    text = _log_through_filter(
        (logging.INFO, "Handler 'owned_changed' succeeded."),
        (logging.INFO, "Handler 'cleanup' succeeded."),
        (logging.INFO, "deleting ManifestWork c1/w: cluster left"),
        (logging.ERROR, "Handler 'owned_changed' failed with an exception and will try again"),
    )
    assert "owned_changed' succeeded" not in text
    assert "Handler 'cleanup' succeeded." in text
    assert "deleting ManifestWork c1/w: cluster left" in text
    assert "owned_changed' failed" in text


def test_every_quiet_name_is_a_registered_event_handler() -> None:
    """A renamed handler would silently log again: the names must exist."""
    registry = kopf.get_default_registry()
    names = {h.id for h in registry._watching.get_all_handlers()}
    assert names >= handlers.QUIET_HANDLERS
