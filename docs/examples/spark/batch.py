# `spark` is the session (a pyspark shell, a notebook, or SparkSession.builder.getOrCreate())
from pathlib import Path

events = str(Path("events").absolute())  # or s3://…, abfss://…, gs://…
table = spark.read.format("deltastream").option("versionAsOf", 1).load(events)

# Like Delta's table_changes: the change rows of versions 1 to 3
changes = (
    spark.read.format("deltastream")
    .option("readChangeFeed", "true")
    .option("startingVersion", 1)
    .option("endingVersion", 3)
    .load(events)
)
changes.select("id", "_change_type", "_commit_version").show()

# Filters and columns given to the source: files that cannot match are not read
nl = (
    spark.read.format("deltastream")
    .option("where", "country = 'NL' AND amount >= 0")
    .option("columns", "id,amount")
    .load(events)
)
print(nl.count())
