# The change rows of versions 1 and 2 (an update, a delete), as JSON lines
deltastream changes events --from 1 --to 2 -o -

# Every change but update pre-images, into a parquet file
deltastream changes events --where "_change_type <> 'update_preimage'" -o changes.parquet
