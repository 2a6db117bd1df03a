# A local table in ./deltastream-demo/table, a writer committing to it every second, and
# deltastream following it, printing each change row (without --duration: until Ctrl-C)
deltastream demo --duration 5
