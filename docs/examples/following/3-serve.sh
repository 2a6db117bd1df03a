# Every table of the configuration in one process, each with its own state and sink
deltastream serve --config deltastream.toml 2> serve.log &
serve_pid=$!
until grep -q '"_commit_version": 3' events-log.jsonl 2>/dev/null && [ -n "$(ls out/events)" ]; do
    kill -0 "$serve_pid"  # (fails if serve has stopped)
    sleep 0.2
done
kill -TERM "$serve_pid"  # both streams stop cleanly, their state saved
wait "$serve_pid"
