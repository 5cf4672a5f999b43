"""The application: the optimize pipeline (``optimize`` running the typed ``phases``), batches (``batch``,
``batch_model``, ``batch_ray``) and the command line (``cli``).
"""
