# An S3-compatible store (MinIO, Ceph, …) at $S3_ENDPOINT_URL; the keys come from the
# environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), as for any AWS tool. On AWS
# itself, leave endpoint_url out and give the region.
deltastream snapshot s3://lake/events --storage-option endpoint_url="$S3_ENDPOINT_URL"

# A stream whose state lives in the same store: --state-storage-option defaults to the
# table's options when both are on S3
deltastream tail s3://lake/events --mode snapshot \
    --storage-option endpoint_url="$S3_ENDPOINT_URL" \
    --state s3://lake/deltastream/state/events --sink jsonl:events.jsonl
