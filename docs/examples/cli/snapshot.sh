# The latest version's summary: version, commit time, files, size, protocol, metadata
deltastream snapshot events

# Time travel, by version or by time, checking the writer's .crc file when there is one
deltastream snapshot events --version 1 --validate-checksum
