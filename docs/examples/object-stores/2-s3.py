import os

import deltastream

options = {"endpoint_url": os.environ["S3_ENDPOINT_URL"]}  # on AWS: {"region": "eu-west-1"}
snap = deltastream.read_snapshot("s3://lake/events", storage_options=options)
rows = deltastream.read_rows("s3://lake/events", storage_options=options).read_all()
print(snap.version, rows.num_rows)
