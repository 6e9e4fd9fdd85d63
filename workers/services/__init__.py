"""The long-running processes: sync hook workers (``worker``), async hook workers
(``async_worker``), the coordinator service for foreign agents (``coordinator_service``), the
HTTP gateway (``gateway``); their health probes (``probes``), the watchdog that names a hook
holding the event loop (``loopwatch``), and how they load hook classes (``loading``)."""
