"""`convexport rules test`: random instances of a rule's pattern (instances.py, from one
sampler per op in samplers.py, choices drawn in draws.py), rewritten by the rule alone and
checked against the original with ONNX Runtime (verify.py)."""
