"""One stream: following a table and delivering its change rows to a sink, exactly where it
left off after a crash.

:mod:`~deltastream.daemon.stream.tailer` runs a stream; :mod:`~deltastream.daemon.stream.config`
defines its settings; the watcher and its poll schedule find new versions; the table follower
judges and plans each version, the pump delivers its rows and commits them to the stream's
:mod:`~deltastream.daemon.stream.state`; resume finds where a stream starts, and reset starts
it over. It uses sinks through the seam in :mod:`deltastream.daemon.delivery`.
"""
