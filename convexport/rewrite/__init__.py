"""Rule files, pattern matching and the rewrite engine."""
