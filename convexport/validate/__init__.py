"""The validate stage's code: the optimized graph against the original (compare.py), judged
against the exact result (exact_check.py; float64/ evaluates a model in double precision,
torch_reference.py runs a torch source's own float64 forward)."""
