import anyio

import deltastream


async def main() -> None:
    async with anyio.create_task_group() as tg:

        async def on_rows(delivery: deltastream.Delivery) -> None:
            print(delivery)  # Delivery(table='events', start='v1', end='v4', rows=5)
            for batch in delivery.batches:  # pyarrow.RecordBatch: the table's columns, then
                print(batch.to_pylist()[0])  # _change_type, _commit_version, _commit_timestamp
            if delivery.to_version >= 3:
                tg.cancel_scope.cancel()  # a service would follow on until cancelled

        await deltastream.tail(
            "events", on_rows, state="state/events-py", mode="follow", start=1, poll_interval=0.5
        )


anyio.run(main)
