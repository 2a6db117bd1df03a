import anyio

import deltastream


async def main() -> None:
    # A table handle holds its store's clients open: for services that read repeatedly
    async with deltastream.open_table("events") as table:
        latest = await table.latest_version()
        first = await table.snapshot(version=0)
        at = await table.version_at(first.timestamp_ms, deltastream.TimestampSearch.AT_OR_AFTER)
        print(latest, at)

        async with await deltastream.table_changes(table, start_version=1) as changes:
            async for batch in changes:  # pyarrow.RecordBatch
                print(batch.num_rows)


anyio.run(main)
