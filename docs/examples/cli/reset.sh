deltastream tail events --mode snapshot --sink jsonl:events.jsonl --state state/events

# Start that stream over: remove what it wrote (events.jsonl) and its state
deltastream reset --state state/events --sink jsonl:events.jsonl --name events
