# The change data feed from version 1 on, as JSON lines on stdout
deltastream changes deltastream-demo/table --from 1 -o -

# Only some changes, two columns, into a parquet file
deltastream changes deltastream-demo/table --from 1 \
    --where "_change_type <> 'update_preimage'" --columns id,amount -o changes.parquet
