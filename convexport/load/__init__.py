"""The load and export stages' code: a model as the user gives it (routes/, one module per kind,
the torch archives and the untrusted readers), its ONNX graph (export.py, onnx_route.py, the
float32 twin of a float16 model), and the inputs it runs on (specs, data files, made-up data)."""
