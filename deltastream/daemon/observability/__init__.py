"""What the daemon tells its operators: each stream's metrics and their Prometheus
exposition, log formats and each stream's periodic summary line, the progress bar, and the
redaction that keeps credentials out of all of them."""
