# In a pyspark shell or notebook, where `spark` is the session
from pathlib import Path

import deltastream.spark

deltastream.spark.register(spark)  # needed only where Spark does not find the format itself

table = str(Path("deltastream-demo/table").absolute())  # Spark wants absolute paths or URIs
orders = spark.read.format("deltastream").load(table)
orders.groupBy("country").sum("amount").show()

changes = (
    spark.read.format("deltastream")
    .option("readChangeFeed", "true")
    .option("startingVersion", 1)
    .load(table)
)
changes.groupBy("_change_type").count().show()
