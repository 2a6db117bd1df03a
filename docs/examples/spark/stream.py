from pathlib import Path

events, out = (str(Path(p).absolute()) for p in ("events", "events-cdf"))

# The change data feed as a stream: the current rows first (as inserts), then every change
query = (
    spark.readStream.format("deltastream")
    .option("readChangeFeed", "true")
    .option("maxFilesPerTrigger", 100)
    .load(events)
    .writeStream.format("parquet")
    .option("checkpointLocation", out + "-checkpoint")
    .option("path", out)
    .trigger(availableNow=True)  # what exists now, then stop; or processingTime="1 minute"
    .start()
)
query.awaitTermination()
print(spark.read.parquet(out).count())
