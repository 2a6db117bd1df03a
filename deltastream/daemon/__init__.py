"""The tailer: follows Delta tables, delivers their change rows to sinks, survives crashes.

Its parts, each importing only those listed before it:

* :mod:`~deltastream.daemon.delivery` (positions, deliveries, the sink interface)
  and :mod:`~deltastream.daemon.crashpoints`;
* :mod:`~deltastream.daemon.sinks` (where rows go) and
  :mod:`~deltastream.daemon.observability` (metrics, logs, the progress bar, redaction),
  independent of each other;
* :mod:`~deltastream.daemon.stream` (one stream: its settings, state and delivery loop);
* :mod:`~deltastream.daemon.service` (many streams in one process, its configuration and its
  HTTP server);
* :mod:`~deltastream.daemon.api` (:func:`~deltastream.daemon.api.tail`, from Python).
"""
