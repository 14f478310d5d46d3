"""The profile stage's code: latency timed in pairs (paired_timer.py), the sizes a dynamic
model is timed at, peak memory, per-op time (profiler.py), and the environment measured on."""
