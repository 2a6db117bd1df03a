# The table as it is now, every row as an insert, into a JSON-lines file; the stream's
# position is kept in state/orders
deltastream tail deltastream-demo/table --mode snapshot \
    --sink jsonl:orders.jsonl --state state/orders
head -n 2 orders.jsonl
