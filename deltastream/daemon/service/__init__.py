"""Many streams in one process, and its surface: the supervisor
(:class:`~deltastream.daemon.service.supervisor.Service`), its TOML configuration, start-up
checks, the HTTP server (``/healthz``, ``/livez``, ``/metrics``) and its address, and
systemd's notifications."""
