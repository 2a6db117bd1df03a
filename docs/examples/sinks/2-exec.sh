# Run a command per delivery: the rows are in the parquet file $DELTASTREAM_BATCH_PATH
cat > load.sh <<'SCRIPT'
echo "$DELTASTREAM_TABLE: versions $DELTASTREAM_FROM_VERSION-$DELTASTREAM_TO_VERSION," \
     "$DELTASTREAM_ROWS rows in $DELTASTREAM_BATCH_PATH" >> loads.txt
SCRIPT
deltastream tail events --mode follow --from 0 --state state/events-exec --sink 'exec:sh load.sh' &
tail_pid=$!
until [ -s loads.txt ]; do kill -0 "$tail_pid"; sleep 0.2; done  # exit 0 commits the delivery
kill -TERM "$tail_pid"; wait "$tail_pid"
cat loads.txt
