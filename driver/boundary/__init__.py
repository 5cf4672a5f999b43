"""The ONNX boundary: models read into the e-graph and written back (``onnx_import``, ``onnx_export``),
checked (``verify``, ``feeds``, ``bindings``), timed (``latency``, ``torch_runtime``), the files relsat
writes (``outputs``) and the built-in models (``zoo``).
"""
