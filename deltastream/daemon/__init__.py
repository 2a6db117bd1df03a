"""The tailer: follows Delta tables, delivers their change rows to sinks, survives crashes."""
